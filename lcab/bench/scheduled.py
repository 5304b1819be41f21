"""Run a cell as one rank of a scheduler's job: under SLURM every task of the job is a rank.

Each task joins the world from its environment and watches itself (``rank-<r>.log``,
``rank-<r>.json``, a watchdog per length); a failing rank writes ``rank-<r>.failure.json`` and
exits at once, and a failure after the scheduler's SIGTERM is the scheduler's stop, not the lost
peer it then ran into. Rank 0 alone emits records. The story: ``lcab/launch/README.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from lcab.bench.environment import environment
from lcab.bench.results import is_oom, short_error
from lcab.bench.runner import run_cell
from lcab.bench.targets import make_target
from lcab.cell import Cell
from lcab.distributed.context import node_name
from lcab.lazy import lazy_module
from lcab.records.schema import RunRecord

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

SCHEDULED_RANKS = "LCAB_RANKS_FROM_SCHEDULER"
"""Set (to the scheduler's name) in every task of a job whose tasks are the cell's ranks."""

JOB_ENVIRONMENT_FILE = "job-environment.json"
"""Where the job (rank 0) says what it runs on, for the records the launcher writes later."""
FAILURE_FILE = "rank-{rank}.failure.json"
RANK_FILE = "rank-{rank}.json"
LOG_FILE = "rank-{rank}.log"
SIGTERM_GRACE_S = 2.0
"""How long a failing rank waits for the scheduler's SIGTERM that may have caused it."""


@dataclass(frozen=True)
class RankFailure:
    """Why one rank stopped (written by the rank, read by the launcher)."""

    rank: int
    host: str
    seqlen: int | None
    status: str
    """timeout | oom | error."""
    error: str
    stopped_by_scheduler: bool = False
    """The scheduler's SIGTERM had reached this rank: the job's state names the failure."""


_SCHEDULER_SIGNALS: list[int] = []


def watch_scheduler_signals() -> None:
    """Note a SIGTERM from the scheduler (scancel, time limit, pre-emption), then pass it on.

    A worker killed by the same signal must not be recorded as the cell's ``error``, hiding the
    scheduler's state. The previous handler (submitit's) still runs. Call in the main thread.
    """
    previous = signal.getsignal(signal.SIGTERM)

    def note(signum: int, frame: FrameType | None) -> None:
        _SCHEDULER_SIGNALS.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, note)


def stopped_by_scheduler(grace_s: float = 0.0) -> bool:
    """Whether the scheduler's SIGTERM arrived, waiting up to ``grace_s`` for it to be handled."""
    deadline = time.monotonic() + grace_s
    while not _SCHEDULER_SIGNALS and time.monotonic() < deadline:
        time.sleep(0.05)  # the signal handler runs between these sleeps
    return bool(_SCHEDULER_SIGNALS)


def scheduled_rank(env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(rank, world) of this task when the scheduler started the cell's ranks, else None."""
    if not env.get(SCHEDULED_RANKS):
        return None
    if "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"]), int(env.get("SLURM_NTASKS", "1"))
    return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))


def classify(err: BaseException) -> str:
    """The record status of a rank's exception (submitit's time-limit notice is a timeout)."""
    if is_oom(err):
        return "oom"
    text = str(err).lower()
    timed_out = ("timed out", "timed-out", "timeout")
    return "timeout" if any(t in text for t in timed_out) else "error"


def write_job_environment(cell: Cell) -> None:
    """Rank 0 notes its environment, for the records the launcher writes (not the login node's).

    Best effort: a folder that cannot take it costs only that detail.
    """
    path = Path(cell.job.output_dir) / JOB_ENVIRONMENT_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(environment(cell.device)))
    except OSError:
        pass


def read_job_environment(cell_dir: Path) -> dict[str, object] | None:
    """What `write_job_environment` wrote, or None (the job never started, or it failed)."""
    try:
        data = json.loads((cell_dir / JOB_ENVIRONMENT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_failures(cell_dir: Path) -> list[RankFailure]:
    """Failures the ranks of a cell reported, earliest first."""
    failures = []
    for path in sorted(cell_dir.glob("rank-*.failure.json"), key=lambda p: p.stat().st_mtime):
        try:
            failures.append(RankFailure(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return failures


def read_ranks(cell_dir: Path) -> dict[int, dict[str, object]]:
    """What each rank that started said about itself (``rank-<r>.json``: node, pid)."""
    ranks = {}
    for path in cell_dir.glob("rank-*.json"):
        try:
            ranks[int(path.name.split("-")[1].split(".")[0])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return ranks


class _Watchdog:
    """Ends this rank when one length runs past ``timeout_s`` (a hang stops no one)."""

    def __init__(self, timeout_s: float, on_expire: Callable[[int | None], None]) -> None:
        self.timeout_s, self.on_expire = timeout_s, on_expire
        self.deadline: float | None = None
        self.seqlen: int | None = None
        threading.Thread(target=self._watch, daemon=True, name="lcab-watchdog").start()

    def arm(self, seqlen: int) -> None:
        self.seqlen, self.deadline = seqlen, time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.on_expire(self.seqlen)


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (also C-level output) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_as_rank(cell: Cell, emit: Callable[[RunRecord], None], rank: int, world: int) -> None:
    """Run ``cell`` as ``rank`` of the scheduler's world; a failure exits 1 after its file."""
    cell_dir = Path(cell.job.output_dir)
    cell_dir.mkdir(parents=True, exist_ok=True)
    host = node_name()
    (cell_dir / RANK_FILE.format(rank=rank)).write_text(
        json.dumps({"host": host, "pid": os.getpid()})
    )
    _redirect_output(cell_dir / LOG_FILE.format(rank=rank))

    def fail(seqlen: int | None, status: str, error: str, grace_s: float = 0.0) -> None:
        stopped = stopped_by_scheduler(grace_s)
        if stopped:  # what the rank ran into next (a lost peer, say) is not the cause
            at = f" during seqlen {seqlen}" if seqlen is not None else ""
            by = "the scheduler, or srun ending the step"
            error = f"SIGTERM reached this rank ({by}){at}; then: {error}"
        failure = RankFailure(rank, host, seqlen, status, error, stopped)
        path = cell_dir / FAILURE_FILE.format(rank=rank)
        with contextlib.suppress(OSError):  # a full disk: the launcher still settles the job
            path.write_text(json.dumps(asdict(failure)))
        print(f"lcab: rank {rank} on {host} failed ({status}): {error}", file=sys.stderr)
        if stopped:
            print(
                "lcab: the length is left for the launcher to record with the job's state",
                file=sys.stderr,
            )
        sys.stderr.flush()
        os._exit(1)

    if world != cell.world_size:
        fail(None, "error", f"the job has {world} tasks, the cell needs {cell.world_size} ranks")
    watchdog = _Watchdog(
        cell.bench.timeout_s,
        lambda seqlen: fail(
            seqlen, "timeout", f"no result within bench.timeout_s={cell.bench.timeout_s:g} s"
        ),
    )
    threads = cell.bench.threads
    if threads is None and cell.device == "cpu":  # the task's CPUs, not the whole node's
        threads = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
    if threads is not None:
        torch.set_num_threads(threads)
    seqlen: int | None = None
    try:
        target = make_target(cell, rank, None)
        for seqlen in cell.seqlens:
            watchdog.arm(seqlen)
            run_cell(cell.with_seqlens([seqlen]), target, emit if rank == 0 else lambda r: None)
        watchdog.disarm()
        target.close()
    except BaseException as err:  # SystemExit/KeyboardInterrupt too: peers must not wait
        traceback.print_exc()
        error = short_error(err)
        if type(err).__name__ == "UncompletedJobError":  # submitit: the time limit is near
            error = f"SLURM time limit reached ({error})"
        fail(seqlen, classify(err), error, grace_s=SIGTERM_GRACE_S)
