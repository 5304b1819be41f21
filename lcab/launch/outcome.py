"""Records for what a SLURM job did not record itself: every requested length ends with one.

Rank 0 writes a record as each length finishes. When a job ends early — a rank failed, SLURM
cancelled it, its node failed, it hit its time limit or ran out of memory — the launcher calls
`settle` with the job's final state: the first unsettled length gets a record whose status and
reason say what happened (naming the failing rank and its host when a rank reported it), the
lengths after it are ``skipped`` as not run. Nothing is ever left without a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lcab.bench.environment import environment
from lcab.bench.results import base_record
from lcab.bench.scheduled import read_failures, read_hosts
from lcab.cell import Cell
from lcab.records.resume import NOT_RUN
from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, JsonlSink, read_records

#: SLURM job states (sacct) and the record status each gives the length that was running.
STATE_STATUS = {
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "oom",
    "CANCELLED": "error",
    "NODE_FAIL": "error",
    "BOOT_FAIL": "error",
    "PREEMPTED": "error",
    "FAILED": "error",
}


@dataclass(frozen=True)
class JobEnd:
    """How a SLURM job ended, as the launcher saw it."""

    job_id: str
    state: str
    """sacct's state, first word (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)."""
    detail: str = ""
    """submitit's message when the job left no result."""


def _reason(end: JobEnd, cell_dir: Path, world: int) -> tuple[str, str]:
    """(status, reason) for the length that was running when the job ended."""
    failures = read_failures(cell_dir)
    if failures:
        first = failures[0]
        where = f"rank {first.rank} on {first.host}"
        length = f" at seqlen {first.seqlen}" if first.seqlen is not None else ""
        return (
            first.status,
            f"{where} failed{length}: {first.error} (SLURM job {end.job_id} {end.state})",
        )
    status = STATE_STATUS.get(end.state, "error")
    reason = f"SLURM job {end.job_id} ended {end.state}"
    if world > 1 and end.state == "FAILED":
        hosts = read_hosts(cell_dir)
        missing = [r for r in range(world) if r not in hosts]
        if missing:
            reason += f"; rank(s) {missing} never started"
        else:
            reason += "; a rank died without reporting (killed?), see rank-*.log"
    if end.detail:
        reason += f" ({end.detail[:300]})"
    return status, reason


def settle(cell: Cell, end: JobEnd) -> list[RunRecord]:
    """Write records for the lengths of ``cell`` that its job left unsettled; return them."""
    cell_dir = Path(cell.job.output_dir)
    path = cell_dir / RECORDS_FILE
    done = {r.seqlen for r in read_records(path)} if path.exists() else set()
    pending = [s for s in cell.seqlens if s not in done]
    if not pending:
        return []
    status, reason = _reason(end, cell_dir, cell.world_size)
    env = environment(cell.device)
    env["slurm_job_id"] = end.job_id
    out = []
    for i, seqlen in enumerate(pending):
        record = base_record(cell, seqlen, env)
        this_status = status if i == 0 else "skipped"
        this_reason = reason if i == 0 else f"{NOT_RUN}seqlen {pending[0]} ended in {status}"
        record.status, record.reasons = this_status, [this_reason]
        for p in record.passes:
            record.pass_result(p).status = this_status
            record.pass_result(p).reason = this_reason
        out.append(record)
    sink = JsonlSink(path)
    for record in out:
        sink.write(record)
    return out
