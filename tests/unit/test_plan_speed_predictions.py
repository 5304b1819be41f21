"""The planner's predictions are pinned: a faster planner must predict exactly what it did.

The expected values in ``data/plan_speed_predictions.json`` were produced by the planner as it
was before it was made fast (commit e72b1d7, the slow but plain implementation) on today's H100
profile (its copy rates and empty-block cost as an H100 measured them, 2026-11-27), with this
module run as a script (the command is stored in the fixture). The test recomputes every cell
with today's code through the same path the dry run takes (compose the job, resolve its cell,
`expect_configured_job`) and compares what the dry run prints per length, to the character, and
the planner's own figures (`CellPrediction.row`, what ``python -m lcab.plan`` prints and writes)
to the printed digit, besides the raw TFLOP/s and times to 1e-9.

Regenerate only on purpose (a model change), with the command in the fixture.

Nor is the wall time of a GPU job held to it exactly: issue 58 added an energy window to each
GPU pass read through NVML (`ENERGY_WINDOW_S` of untimed calls, priced by the dry run), so a
GPU length's wall time is the fixture's plus, per pass and mask sample, one window and at most
one call more (a call is never longer than the fixture's whole wall time); a CPU length's is the
fixture's.

Memory (``memory_mib``) is not held to the fixture: issue 52 changed the memory model on
purpose (a profile's kernel terms, Ulysses' head-sharded gradients in the backward), and the
model is checked by hand in ``tests/unit/test_plan_frontier.py``; every time and throughput is.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parent / "data" / "plan_speed_predictions.json"

STRATEGIES = ("ring", "usp", "loongtrain", "ulysses", "ring_allgather")
MASKS = ("causal", "causal_document", "full")
NOT_PINNED = frozenset({"memory_mib"})
ENERGY_WINDOW_S = 1.25
"""NVML's energy counter steps every 100 ms; a window is 10 steps and a quarter (issue 58)."""
"""Row fields a model change moved on purpose since the fixture (see the module docstring)."""
GPU_TOPOLOGIES = ("1x8", "4x8", "12x8")
CPU_TOPOLOGIES = ("local4", "2x4")

GPU = ("launcher=slurm_h100_example", "kernel=fa3", "problem.device=cuda")
CPU = ("kernel=sdpa", "problem.device=cpu", "problem.dtype=float32")


def jobs() -> list[tuple[str, ...]]:
    """Every job pinned: fa3 on the H100 profile (the dry run's default lengths, 1K-8K, on 8
    to 96 GPUs, and 8K tokens per GPU on 8 and 32), and a CPU kernel on the CPU profile."""
    out: list[tuple[str, ...]] = []
    for cp in STRATEGIES:
        for mask in MASKS:
            for topology in GPU_TOPOLOGIES:
                out.append((*GPU, f"cp={cp}", f"mask={mask}", f"topology={topology}",
                            "seqlen=short"))  # fmt: skip
            for topology in GPU_TOPOLOGIES[:2]:
                out.append((*GPU, f"cp={cp}", f"mask={mask}", f"topology={topology}",
                            "seqlen=per_device_8k"))  # fmt: skip
            for topology in CPU_TOPOLOGIES:
                out.append((*CPU, f"cp={cp}", f"mask={mask}", f"topology={topology}",
                            "seqlen=short"))  # fmt: skip
    # the 96-GPU cell at 8K tokens per GPU (786,432 tokens)
    out.append((*GPU, "cp=ring", "mask=causal_document", "topology=12x8", "seqlen=per_device_8k"))
    return out


def _raw(value: Any) -> Any:
    return float(value) if isinstance(value, float) else value


def figures(overrides: tuple[str, ...]) -> list[dict[str, Any]]:
    """What the planner says about one job, per length (the dry run's path)."""
    from lcab.config import resolve_cell
    from lcab.config.preflight import composed_jobs
    from lcab.plan.expected import expect_configured_job

    ((_, cfg),) = composed_jobs(list(overrides), False)
    cell = resolve_cell(cfg)
    out = []
    for length in expect_configured_job(cfg, cell).lengths:
        entry: dict[str, Any] = {"seqlen": length.seqlen, "text": length.text()}
        entry["wall_s"] = float(length.wall_s)
        gpu_windows = len(cell.bench.passes) * max(cell.mask_samples, 1)
        entry["energy_windows"] = gpu_windows if cell.device == "cuda" else 0
        if length.prediction is not None:
            p = length.prediction
            entry["row"] = {k: _raw(v) for k, v in p.row().items()}
            entry["raw"] = {
                f"{name}_{key}": float(getattr(p.pass_(name), key))
                for name in ("fwd", "bwd")
                for key in ("tflops", "time_ms")
            }
        out.append(entry)
    return out


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return bool(got == want)


def _printed(text: str) -> tuple[str, list[float]]:
    """What a dry-run line says, apart from its layout: its words and its numbers in ms.

    The layout changed on purpose after the fixture (``1,024: 0.00613 / 0.00851 (21.9 / 39.5
    ms)`` for ``1024: fwd 0.00613 / bwd 0.00851 TFLOP/s/GPU (...)``, ``1.23 s`` for
    ``1.23e+03 ms``); every printed digit must still be the same.
    """
    numbers = []
    for match in re.finditer(r"(\d+(?:\.\d+)?(?:e[+-]\d+)?)( s\b)?", text.replace(",", "")):
        value = float(match.group(1))
        numbers.append(round(value * 1000 if match.group(2) else value, 9))
    if "no prediction" in text:  # the reason, word for word
        return text.split(":", 1)[1].strip(), numbers
    return "", numbers


def _load() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def _keys() -> list[str]:
    return list(_load()["jobs"]) if FIXTURE.exists() else []


def test_the_fixture_pins_every_job_of_the_grid() -> None:
    """The fixture covers the whole grid (a job dropped from it would go unchecked)."""
    data = _load()
    assert sorted(data["jobs"]) == sorted(" ".join(job) for job in jobs())
    assert data["commit"].startswith("e72b1d7")


def _id(key: str) -> str:
    """``ring-causal-12x8-short-cuda``."""
    words = dict(w.split("=", 1) for w in key.split(" "))
    return "-".join(words[k] for k in ("cp", "mask", "topology", "seqlen", "problem.device"))


@pytest.mark.parametrize("key", _keys(), ids=_id)
def test_predictions_match_those_of_the_planner_before_it_was_made_fast(key: str) -> None:
    want = _load()["jobs"][key]
    got = figures(tuple(key.split(" ")))
    assert [g["seqlen"] for g in got] == [w["seqlen"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert _printed(g["text"]) == _printed(w["text"]), (key, g["text"], w["text"])
        windows_s = g["energy_windows"] * ENERGY_WINDOW_S
        if windows_s and "row" in w:  # a length with no prediction takes no time
            extra = g["wall_s"] - w["wall_s"]
            assert windows_s <= extra <= windows_s + w["wall_s"], (key, g["seqlen"], extra)
        else:
            assert _close(g["wall_s"], w["wall_s"]), (key, g["seqlen"])
        assert ("row" in g) == ("row" in w)
        if "row" in w:
            assert g["row"].keys() == w["row"].keys()
            pinned = {k: v for k, v in w["row"].items() if k not in NOT_PINNED}
            bad = {k: (g["row"][k], v) for k, v in pinned.items() if not _close(g["row"][k], v)}
            assert not bad, (key, g["seqlen"], bad)
            bad = {k: (g["raw"][k], v) for k, v in w["raw"].items() if not _close(g["raw"][k], v)}
            assert not bad, (key, g["seqlen"], bad)


def main() -> None:
    """Write the fixture with the code on ``sys.path`` (run it against the reference commit)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, default=FIXTURE)
    args = parser.parse_args()
    import lcab

    source = Path(lcab.__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = {
        "commit": commit,
        "command": (
            "git worktree add /tmp/base e72b1d7 && cp conf/hardware/h100_nvlink_ib.yaml "
            "/tmp/base/conf/hardware/ && cd /tmp/base && PYTHONPATH=/tmp/base "
            "python <this module> --write <fixture>"
        ),
        "jobs": {" ".join(job): figures(job) for job in jobs()},
    }
    args.write.parent.mkdir(parents=True, exist_ok=True)
    args.write.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(out['jobs'])} jobs to {args.write}", file=sys.stderr)


if __name__ == "__main__":
    main()
