"""Resuming a job: keep the lengths that finished, run only the rest.

Started again in the same output folder with ``resume=true``, a job keeps every record that
*settled* its length (``ok``, ``numerics_mismatch``, or ``skipped`` as unsupported) and runs the
lengths with none or with a record of a run that did not finish (``error``, ``timeout``, ``oom``,
skipped as not run). A record counts only if made with the same result-determining config.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lcab.records.schema import RunRecord
from lcab.records.sinks import read_records

RERUN_STATUSES = frozenset({"error", "timeout", "oom"})
"""Statuses of runs that did not finish: resuming runs their lengths again."""
NOT_RUN = "not run: "
"""Reason prefix of lengths skipped because an earlier length of the job failed."""
_NOT_RESULTS = ("resume", "logger", "study")
"""Top-level config keys that do not change a measurement (where and how it is reported)."""


def result_config(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that determines one length's result.

    Drops reporting keys, ``bench.progress`` and ``seqlen.values`` (a record is one length).
    """
    out = {k: v for k, v in config.items() if k not in _NOT_RESULTS}
    if isinstance(out.get("bench"), dict):
        out["bench"] = {k: v for k, v in out["bench"].items() if k != "progress"}
    if isinstance(out.get("seqlen"), dict):
        out["seqlen"] = {k: v for k, v in out["seqlen"].items() if k != "values"}
    return out


def settled(record: RunRecord) -> bool:
    """Whether ``record`` is a final answer for its length (resuming keeps it)."""
    if record.status in RERUN_STATUSES:
        return False
    return not (record.status == "skipped" and any(r.startswith(NOT_RUN) for r in record.reasons))


SEARCH_RAN = frozenset({"ok", "numerics_mismatch", "oom"})
"""Probe statuses of a frontier search that ran to its end (`lcab.bench.frontier`)."""


def settled_length(record: RunRecord) -> int | None:
    """The length of the job ``record`` settles (None: it settles none).

    A frontier record (filed under the longest probe that ran) settles the job's first probe
    length when every probe ran to its end (``ok`` or ``oom``), none when one errored.
    """
    if record.frontier_probes:
        if all(p.get("status") in SEARCH_RAN for p in record.frontier_probes):
            return int(record.frontier_probes[0]["seqlen"])
        return None
    return record.seqlen if settled(record) else None


def split_done(
    path: Path, seqlens: Sequence[int], config: dict[str, Any]
) -> tuple[list[RunRecord], list[int]]:
    """(records to keep, lengths still to run) for a job writing to ``path``.

    The last settled record of a length wins; records of lengths no longer asked for are kept.
    """
    if not path.exists():
        return [], list(seqlens)
    wanted = result_config(config)
    kept: dict[int, RunRecord] = {}
    for record in read_records(path):
        length = settled_length(record)
        if length is not None and result_config(record.config) == wanted:
            kept[length] = record
    todo = [s for s in seqlens if s not in kept]
    return [kept[length] for length in sorted(kept)], todo
