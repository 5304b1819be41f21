"""Records for what a SLURM job did not record itself: every requested length ends with one.

When a job ends early (a rank failed; SLURM cancelled it, its node failed, time or memory ran
out) the launcher calls `settle`: the first unsettled length gets a record saying what happened
(the failing rank and host when known), the lengths after it are ``skipped`` as not run.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lcab.bench.environment import environment
from lcab.bench.results import unfinished_records
from lcab.bench.scheduled import RankFailure, read_failures, read_job_environment, read_ranks
from lcab.cell import Cell
from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, JsonlSink, RecordWriteError, read_records

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


NOT_SUBMITTED = "NOT_SUBMITTED"
"""The state of a job sbatch refused (``detail`` holds the scheduler's message)."""
NOT_BUILDABLE = "NOT_BUILDABLE"
"""The state of a cell lcab did not submit: it cannot be laid out on its topology (``detail``
says why; `lcab.launch.refusals.layout_problems`). Its records are ``skipped``."""


@dataclass(frozen=True)
class JobEnd:
    """How a SLURM job ended, as the launcher saw it."""

    job_id: str
    state: str
    """sacct's state, first word (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)."""
    detail: str = ""
    """submitit's message when the job left no result."""
    srun_log: str = ""
    """The job's srun messages (batch stderr): which task was killed, on which node."""


_SRUN_TASKS = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)")
_OOM_KILL = re.compile(r"oom[-_]kill event")
"""slurmstepd's word that the step's cgroup killed for memory ("Detected 1 oom-kill event(s)",
newer "oom_kill event"): a task srun reports Killed is out of memory only with it."""
#: What a rank reports when a *peer* failed: lost connections and communication time-outs.
#: (A rank's own hang is reported by its watchdog, whose message has none of these.)
_PEER_SYMPTOMS = (
    *("connection closed by peer", "connection reset", "broken pipe", "timed out"),
    *("gloo", "nccl"),
)


def killed_ranks(srun_log: str) -> list[tuple[int, str, str]]:
    """(rank, node, how) of every task srun reports as ended by a signal, not an exit code."""
    out = []
    for node, spec, how in _SRUN_TASKS.findall(srun_log):
        if "exit code" in how:
            continue
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            out += [(r, node, how.strip()) for r in range(int(lo), int(hi or lo) + 1)]
    return out


_SCHEDULER_ENDS = tuple(state for state in STATE_STATUS if state != "FAILED")
"""States in which SLURM itself ended the job (FAILED: a task exited non-zero)."""


def _at(failure: RankFailure) -> str:
    """' at seqlen N' for a failure that knows its length, else nothing."""
    return f" at seqlen {failure.seqlen}" if failure.seqlen is not None else ""


def _reason(end: JobEnd, cell_dir: Path, world: int) -> tuple[str, str]:
    """(status, reason) for the length that was running when the job ended.

    The root cause first: the scheduler ending the job; else a rank's own report of a real
    error (not one after a SIGTERM, srun's ``--kill-on-bad-exit`` for a dead peer); else a rank
    srun names as killed by a signal, before peers that merely lost their connection to it.
    """
    job = f"SLURM job {end.job_id} {end.state}"
    if end.state == NOT_SUBMITTED:
        return "error", f"SLURM refused the job: {end.detail}"
    if end.state == NOT_BUILDABLE:
        return "skipped", f"not submitted: {end.detail}"
    if end.state in _SCHEDULER_ENDS:
        return STATE_STATUS[end.state], f"SLURM job {end.job_id} ended {end.state}"
    failures = read_failures(cell_dir)
    real = [
        f
        for f in failures
        if not f.stopped_by_scheduler and not any(s in f.error.lower() for s in _PEER_SYMPTOMS)
    ]
    reported = {f.rank for f in failures}
    killed = [k for k in killed_ranks(end.srun_log) if k[0] not in reported]
    if real:
        first = real[0]
        return (
            first.status,
            f"rank {first.rank} on {first.host} failed{_at(first)}: {first.error} ({job})",
        )
    if killed:
        rank, node, how = killed[0]
        oom = _OOM_KILL.search(end.srun_log) is not None
        status = "oom" if how == "Killed" and oom else "error"
        hint = ""
        if how == "Killed":
            hint = " (SIGKILL; slurmstepd " + (
                "logged an oom-kill event)" if oom else "logged no oom-kill event: not memory)"
            )
        return status, f"rank {rank} on {node} died: {how}{hint}; its peers lost it ({job})"
    if failures:
        first = failures[0]
        return first.status, f"rank {first.rank} on {first.host} failed: {first.error} ({job})"
    reason = f"SLURM job {end.job_id} ended {end.state}"
    if world > 1 and end.state == "FAILED":
        started = read_ranks(cell_dir)
        missing = [r for r in range(world) if r not in started]
        if missing:
            reason += f"; rank(s) {missing} never started"
    if end.detail:
        reason += f" ({end.detail[:300]})"
    return STATE_STATUS.get(end.state, "error"), reason


def result_can_change(cell: Cell, end: JobEnd) -> bool:
    """Whether a task's result file could still change what `settle` writes for ``end``.

    A result's text is used only when nothing else explains the end: not when SLURM ended the
    job, every length has its record, or a rank's report or srun names the cause. Otherwise
    the launcher waits for the result files (a shared file system may show them late).
    """
    if end.state in _SCHEDULER_ENDS:
        return False
    cell_dir = Path(cell.job.output_dir)
    path = cell_dir / RECORDS_FILE
    done = {r.seqlen for r in read_records(path)} if path.exists() else set()
    if all(s in done for s in cell.seqlens):
        return False
    return not (read_failures(cell_dir) or killed_ranks(end.srun_log))


def settle(cell: Cell, end: JobEnd) -> list[RunRecord]:
    """Write records for the lengths of ``cell`` that its job left unsettled; return them."""
    cell_dir = Path(cell.job.output_dir)
    path = cell_dir / RECORDS_FILE
    done = {r.seqlen for r in read_records(path)} if path.exists() else set()
    pending = [s for s in cell.seqlens if s not in done]
    if not pending:
        return []
    status, reason = _reason(end, cell_dir, cell.world_size)
    env = job_environment(cell)
    env["slurm_job_id"] = end.job_id
    out = unfinished_records(cell, pending, status, reason, env)
    sink = JsonlSink(path)
    try:
        for record in out:
            sink.write(record)
    except RecordWriteError as err:
        print(f"lcab: cannot record how job {end.job_id} ended: {err}", file=sys.stderr)
    return out


#: Environment fields that describe the host a record ran on (unknown when the job never said).
HOST_FIELDS = ("device_name", "hostname", "num_threads", "slurm_nodelist", "slurm_tasks")


def job_environment(cell: Cell) -> dict[str, Any]:
    """The environment of the job itself, as it wrote it (`write_job_environment`).

    A job that never started leaves the host fields empty (not the submitting host's).
    """
    said = read_job_environment(Path(cell.job.output_dir))
    if said is not None:
        return dict(said)
    env = environment(cell.device)
    return env | dict.fromkeys(HOST_FIELDS)
