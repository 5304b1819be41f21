"""Supervise a cell: its ranks run in watched processes, and every length ends with a record.

Each length's record must arrive within ``bench.timeout_s`` of the previous one; otherwise, or
when a rank raises or dies, every rank is killed, the current length gets a ``timeout`` /
``error`` record (``oom`` for a SIGKILL while the cgroup counted an OOM kill) and the lengths
never reached ``skipped`` ones. In a job the scheduler ended, the lengths are left to the
launcher, which records them with the scheduler's state (`lcab.launch.outcome`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcab.bench.environment import environment
from lcab.bench.job_memory import oom_kills
from lcab.bench.results import NULL_WITHOUT_ERROR, OOM_WORDS, unfinished_records
from lcab.bench.scheduled import scheduled_rank, stopped_by_scheduler
from lcab.cell import Cell
from lcab.distributed.launch import LaunchResult, launch
from lcab.records.schema import RunRecord


def _status(result: LaunchResult, host_budget: bool, oom_killed: bool) -> str:
    """How a world that did not finish ended (``host_budget``: under RLIMIT_DATA)."""
    if result.status == "timeout":
        return "timeout"
    if "SIGKILL" in result.reason and oom_killed:
        return "oom"
    said = f"{result.reason}\n{result.detail}".lower()
    if host_budget and NULL_WITHOUT_ERROR in said:
        return "oom"  # a failed malloc said as a SystemError (`lcab.bench.results.is_oom`)
    return "oom" if any(words in said for words in OOM_WORDS) else "error"


def _scheduler_stopped_it() -> bool:
    """Whether the scheduler ended this job (waiting briefly for its SIGTERM to arrive here)."""
    return scheduled_rank() is not None and stopped_by_scheduler(grace_s=2.0)


def run_supervised(cell: Cell, on_record: Callable[[RunRecord], None]) -> list[RunRecord]:
    """Run ``cell`` in watched rank processes; every length of the cell ends with one record."""
    from lcab.bench.worker import PRELOAD, worker_main

    records: list[RunRecord] = []
    pending = list(cell.seqlens)
    kills = oom_kills()
    timeout = cell.bench.timeout_s

    def accept(record: RunRecord) -> None:
        records.append(record)
        on_record(record)

    def on_message(msg: tuple[Any, ...]) -> float | None:
        if msg[0] != "record":
            return None
        record = RunRecord.from_dict(msg[1])
        if record.seqlen in pending:
            pending.remove(record.seqlen)
        accept(record)
        return timeout  # the next length gets a fresh deadline

    result = launch(
        worker_main,
        cell.world_size,
        (cell,),
        timeout,
        on_message,
        Path(cell.job.output_dir),
        preload=PRELOAD,
    )
    if result.status != "done" and pending and _scheduler_stopped_it():
        print(
            f"lcab: the scheduler stopped this job (SIGTERM) during seqlen {pending[0]}; "
            f"seqlen {pending} left for the launcher to record with the job's state",
            file=sys.stderr,
        )
        return records
    if result.status != "done" and pending:
        oom_killed = kills is not None and (oom_kills() or 0) > kills
        host_budget = cell.device == "cpu" and cell.bench.memory_budget_gib is not None
        status = _status(result, host_budget, oom_killed)
        reason = result.reason
        if "SIGKILL" in reason:
            reason += (
                " (the out-of-memory killer: the memory cgroup counted a kill)"
                if oom_killed
                else " (no out-of-memory kill counted: a scheduler's, a user's or another kill)"
            )
        if status == "timeout":
            reason = f"no result within bench.timeout_s={timeout:g} s; ranks killed"
        unfinished = unfinished_records(cell, pending, status, reason, environment(cell.device))
        unfinished[0].error_msg = result.detail[-1000:] or None
        for record in unfinished:
            accept(record)
    return records
