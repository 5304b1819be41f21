"""lcab's side of a comparison with published figures: measured rows and the planner's rows.

`read_lcab_rows` reads records (as ``report build`` does) and the planner's ``plan.jsonl`` files
into one `LcabRow` per cell and length: shape, GPU model, TFLOP/s and ms per pass. Planner rows
lack heads and dtype: those come from the sweep's ``multirun.yaml`` ``problem`` node (a job's
own overrides on top), else from what ``problem: auto`` resolves to on the profile's device,
said in the row's note; the GPU model is the profile's ``description``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lcab.config import CONF_DIR
from lcab.flops import PASSES
from lcab.records.sinks import RECORDS_FILE
from lcab.report.frame import BadInputError, finite, load_records

MEASURED = "measured"
PREDICTED = "predicted (planner)"
PLAN_FILE = "plan.jsonl"
"""The planner's rows of one job (``lcab.plan.app.PLAN_FILE``; report may not import plan)."""
PLAN_KEYS = frozenset({"cp", "kernel", "mask", "seqlen", "world", "fwd_tflops", "hardware"})
"""Keys every planner row has: how a file is told to hold planner rows."""
_MODEL = re.compile(r"(?<![A-Z0-9])((?:GB|GH|MI|[ABHLPTV])\d{1,3}[A-Z]?)(?![A-Z0-9])")


def gpu_model(name: str) -> str | None:
    """The GPU model in a device or profile name (``NVIDIA H100 80GB HBM3`` -> ``H100``), or None.

    The first stand-alone token of a family's letters, digits and at most one letter, so H100
    never reads as H200 and ``HBM3``, ``SXM5`` or ``x86`` are no model.
    """
    found = _MODEL.search(name.upper())
    return found.group(1) if found else None


@dataclass(frozen=True)
class LcabRow:
    """One lcab cell at one length: its shape and its figures per pass."""

    label: str
    """`MEASURED` or `PREDICTED`."""
    source: str
    """The file it was read from."""
    kernel: str
    cp: str
    mask: str
    seqlen: int
    world: int
    gpu: str | None
    """GPU model (None: CPU, or not known)."""
    heads_q: int | None
    heads_kv: int | None
    head_dim: int | None
    dtype: str | None
    mask_params: dict[str, Any] = field(default_factory=dict)
    gpus_per_node: int | None = None
    batch: int = 1
    """lcab runs one (packed) sequence a call."""
    tflops: dict[str, float] = field(default_factory=dict)
    """Per pass that ran ``ok``: TFLOP/s (per device under CP, slowest rank)."""
    ms: dict[str, float] = field(default_factory=dict)
    note: str = ""


def rows_from_frame(frame: Any) -> list[LcabRow]:
    """Measured rows of a `load_records` frame: each record's ``ok`` passes."""
    out = []
    for r in frame.to_dict("records"):
        tflops: dict[str, float] = {}
        ms: dict[str, float] = {}
        for p in PASSES:
            value = finite(r.get(f"{p}_tflops"))
            if r.get(f"{p}_status") == "ok" and value is not None:
                tflops[p] = value
                if (time := finite(r.get(f"{p}_ms_p50"))) is not None:
                    ms[p] = time
        on_gpu = r.get("device") != "cpu"
        out.append(
            LcabRow(
                label=MEASURED,
                source=str(r["source"]),
                kernel=r["kernel"],
                cp=r["cp"],
                mask=r["mask"],
                seqlen=int(r["seqlen"]),
                world=int(r["world_size"]),
                gpu=gpu_model(str(r.get("device_name") or "")) if on_gpu else None,
                heads_q=int(r["heads_q"]),
                heads_kv=int(r["heads_kv"]),
                head_dim=int(r["head_dim"]),
                dtype=r["dtype"],
                mask_params=dict(r.get("mask_params") or {}),
                gpus_per_node=int(r["devices_per_node"]),
                tflops=tflops,
                ms=ms,
            )
        )
    return out


def _yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _job_overrides(folder: Path) -> dict[str, str]:
    """``problem.*`` overrides a multirun job folder is named by (``3_problem.heads_q=32,...``)."""
    _, _, overrides = folder.name.partition("_")
    pairs = (item.partition("=") for item in overrides.split(","))
    return {
        k.removeprefix("problem."): v for k, sep, v in pairs if sep and k.startswith("problem.")
    }


def _plan_shape(plan: Path, hardware: str) -> tuple[dict[str, Any], str | None, str]:
    """(problem, GPU model, note) of a planner job: heads, head dim and dtype, resolved."""
    from lcab.config.resolve import CPU_PROBLEM, GPU_PROBLEM

    candidates = (d / "multirun.yaml" for d in (plan.parent, plan.parent.parent))
    sweep = next((f for f in candidates if f.is_file()), None)
    config = _yaml(sweep) if sweep else {}
    problem = dict(config.get("problem") or {})
    problem.update(_job_overrides(plan.parent))
    profile = config.get("hardware") or {}
    if profile.get("name") != hardware:
        file = CONF_DIR / "hardware" / f"{hardware}.yaml"
        profile = _yaml(file) if file.is_file() else {}
    device = str(profile.get("device", ""))
    defaults = GPU_PROBLEM if device == "cuda" else CPU_PROBLEM
    assumed = [k for k in defaults if problem.get(k) in (None, "auto")]
    chosen: dict[str, Any] = {k: defaults[k] if k in assumed else problem[k] for k in defaults}
    shape = {k: v if k == "dtype" else int(v) for k, v in chosen.items()}
    note = ""
    if not profile:
        note = f"hardware profile {hardware!r} not found: GPU model unknown"
    elif sweep is None:
        note = "no multirun.yaml beside it: problem defaults assumed"
    elif assumed and device:
        note = f"problem: auto on {device}"
    model = gpu_model(str(profile.get("description", ""))) if device == "cuda" else None
    return shape, model, note


def plan_rows(path: Path) -> list[LcabRow]:
    """Predicted rows of one ``plan.jsonl`` (BadInputError names a line that is not one)."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            assert isinstance(row, dict) and row.keys() >= PLAN_KEYS
        except (json.JSONDecodeError, AssertionError) as err:
            raise BadInputError(f"{path}:{number}: not a planner row ({PLAN_FILE})") from err
        shape, model, note = _plan_shape(path, str(row["hardware"]))
        passes = [p for p in PASSES if finite(row.get(f"{p}_tflops")) is not None]
        out.append(
            LcabRow(
                label=PREDICTED,
                source=str(path),
                kernel=row["kernel"],
                cp=row["cp"],
                mask=row["mask"],
                seqlen=int(row["seqlen"]),
                world=int(row["world"]),
                gpu=model,
                gpus_per_node=int(row["world"]) // int(row.get("nodes") or 1),
                tflops={p: float(row[f"{p}_tflops"]) for p in passes},
                ms={p: float(row[f"{p}_time_ms"]) for p in passes if f"{p}_time_ms" in row},
                note="; ".join(n for n in (f"harness {row.get('harness', 'lcab')}", note) if n),
                **shape,
            )
        )
    return out


def _kind(path: Path) -> str:
    """``records`` or ``plan`` for a file, from its first line (BadInputError: neither)."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        first = next((line for line in fh if line.strip()), "")
    try:
        data = json.loads(first)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and "schema_version" in data:
        return "records"
    if isinstance(data, dict) and data.keys() >= PLAN_KEYS:
        return "plan"
    raise BadInputError(
        f"{path}: neither lcab records (records.jsonl) nor planner rows ({PLAN_FILE})"
    )


def read_lcab_rows(paths: Sequence[str | Path]) -> list[LcabRow]:
    """Measured and predicted rows of ``paths`` (BadInputError: a path holding neither)."""
    records: list[Path] = []
    plans: list[Path] = []
    for given in map(Path, paths):
        if not given.exists():
            raise BadInputError(f"{given}: no such file or folder")
        if given.is_dir():
            found = sorted(given.rglob(PLAN_FILE))
            if not found and not any(given.rglob(RECORDS_FILE)):
                raise BadInputError(
                    f"{given}: no {RECORDS_FILE} or {PLAN_FILE} in this folder or below it"
                )
            plans += found
            records += [given] if any(given.rglob(RECORDS_FILE)) else []
        elif _kind(given) == "plan":
            plans.append(given)
        else:
            records.append(given)
    rows = rows_from_frame(load_records(records)) if records else []
    return rows + [row for plan in plans for row in plan_rows(plan)]
