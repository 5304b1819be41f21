"""What differs between two campaigns that could explain a difference in their times.

`provenance_table` sets side by side, for each of `PROVENANCE`, each campaign's values (distinct
texts, or a range for numbers), marking what differs (``≠``; ``?`` where one side lacks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from lcab.flops import PASSES


def _commit(r: dict[str, Any]) -> str | None:
    sha = r.get("git_sha")
    return f"{sha[:10]}{' +dirty' if r.get('git_dirty') else ''}" if sha else None


def _binaries(r: dict[str, Any]) -> str | None:
    found = r.get("kernel_binary")
    return f"{r['kernel']} " + " ".join(sorted(found.values())) if found else None


def _protocol(r: dict[str, Any]) -> str:
    bench = (r.get("config") or {}).get("bench") or {}
    keys = ("warmup", "warmup_ms", "reps", "rep_ms", "mask_samples", "flush_l2")
    return ", ".join(f"{k} {bench[k]}" for k in keys if bench.get(k) is not None)


def _per_pass(*suffixes: str) -> Callable[[dict[str, Any]], list[Any]]:
    return lambda r: [r.get(f"{p}_{s}") for p in PASSES for s in suffixes]


PROVENANCE: tuple[tuple[str, Callable[[dict[str, Any]], Any], bool], ...] = (
    ("lcab commit", _commit, False),
    ("torch", lambda r: r.get("torch_version"), False),
    ("torch build", lambda r: (r.get("torch_build") or "")[:12] or None, False),
    ("CUDA", lambda r: r.get("cuda_version"), False),
    ("cuDNN", lambda r: r.get("cudnn_version"), False),
    ("NCCL", lambda r: r.get("nccl_version_loaded") or r.get("nccl_version"), False),
    ("driver", lambda r: r.get("driver_version"), False),
    ("kernel package", lambda r: r.get("kernel_package_version"), False),
    ("kernel binary", _binaries, False),
    ("device", lambda r: r.get("device_name"), False),
    ("host", lambda r: r.get("hostname"), False),
    ("CPU threads", lambda r: r.get("num_threads"), False),
    ("clock seen (MHz)", _per_pass("clock_mhz_min", "clock_mhz_max"), True),
    ("power seen (W)", _per_pass("power_w_max"), True),
    ("power limit (W)", lambda r: r.get("telemetry_power_limit_w"), False),
    (
        "throttle events",
        lambda r: [e for got in _per_pass("clock_events")(r) for e in got or []],
        False,
    ),
    ("host load", lambda r: [r.get("host_load_start"), r.get("host_load_end")], True),
    ("protocol", _protocol, False),
    ("mask seeds", lambda r: r.get("mask_seed"), False),
)
"""(what, its value(s) in one record, whether it is a number shown as a range): what may
explain a difference between campaigns. A range differs when the two do not overlap."""
IDLE = "GpuIdle"
"""A clock event that only says the GPU waited: not a throttle."""


def _values(frame: pd.DataFrame, read: Callable[[dict[str, Any]], Any]) -> list[Any]:
    found: list[Any] = []
    for row in frame.to_dict("records"):
        value = read(row)
        found += value if isinstance(value, list) else [value]
    return [v for v in found if v is not None and v == v and v != "" and v != IDLE]


def _said(values: list[Any], numeric: bool) -> tuple[str, Any]:
    """(text, what is compared) of one campaign's values of one field."""
    if numeric:
        if not values:
            return "–", None
        lo, hi = min(values), max(values)
        return (f"{lo:.4g}" if lo == hi else f"{lo:.4g}–{hi:.4g}"), (lo, hi)
    distinct = sorted({str(v) for v in values})
    more = f" +{len(distinct) - 4} more" if len(distinct) > 4 else ""
    return "; ".join(distinct[:4]) + more or "–", set(distinct)


def provenance_table(old: pd.DataFrame, new: pd.DataFrame, labels: tuple[str, str]) -> pd.DataFrame:
    """Side by side, each `PROVENANCE` field either campaign has, and whether it differs."""
    rows = []
    for what, read, numeric in PROVENANCE:
        (a, ka), (b, kb) = (_said(_values(f, read), numeric) for f in (old, new))
        if not ka and not kb:
            continue
        if not ka or not kb:
            differs = "?"  # known in one campaign only (records from before it was recorded)
        elif numeric:
            differs = "≠" if ka[1] < kb[0] or kb[1] < ka[0] else ""
        else:
            differs = "≠" if ka != kb else ""
        rows.append({"what": what, labels[0]: a, labels[1]: b, "differs": differs})
    return pd.DataFrame(rows, columns=["what", *labels, "differs"])
