"""Supervise a cell's worker processes: deadlines, crashes and hangs become records.

Each cell runs in ``world_size`` worker processes (one per rank; one for a single device). The
supervisor waits for their records with a deadline per sequence length (``bench.timeout_s``):
past it, every worker is killed and the length gets a ``timeout`` record; a worker that dies
(signal, exit code, Python exception outside the per-length guard) gives an ``error`` record, or
``oom`` when it was SIGKILLed (the kernel's out-of-memory killer). Lengths never reached get
``skipped`` records saying why. So a sweep never dies of one cell and never hangs.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcab.bench.cell import Cell
from lcab.bench.environment import environment
from lcab.bench.runner import base_record
from lcab.records.schema import RunRecord

_CONTEXT: Any = None


def _context() -> Any:
    """A forkserver context whose server has torch and the worker module imported."""
    global _CONTEXT
    if _CONTEXT is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "lcab.bench.worker"])
        _CONTEXT = ctx
    return _CONTEXT


def _failure_record(cell: Cell, seqlen: int, status: str, reason: str) -> RunRecord:
    record = base_record(cell, seqlen, environment(cell.device))
    record.status = status
    record.reasons = [reason]
    for p in record.passes:
        record.pass_result(p).status = status if status != "skipped" else "skipped"
        record.pass_result(p).reason = reason
    return record


def _describe_exit(code: int | None) -> tuple[str, str]:
    """(status, text) for a worker's exit code."""
    if code is not None and code < 0:
        sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else -code
        if code == -signal.SIGKILL:
            return "oom", f"worker killed by {sig}; on Linux that is the out-of-memory killer"
        return "error", f"worker died of signal {sig}"
    return "error", f"worker exited with code {code}"


def run_supervised(cell: Cell, on_record: Callable[[RunRecord], None]) -> list[RunRecord]:
    """Run ``cell`` in worker processes; every length of the cell ends with one record."""
    from lcab.bench.worker import worker_main

    ctx = _context()
    results: queue_mod.Queue[Any] = ctx.Queue()
    rendezvous_dir = Path(cell.job.output_dir) if cell.world_size > 1 else None
    rendezvous = None
    if rendezvous_dir is not None:
        rendezvous_dir.mkdir(parents=True, exist_ok=True)
        rendezvous = str(rendezvous_dir / f".rendezvous-{uuid.uuid4().hex}")
    procs = [
        ctx.Process(target=worker_main, args=(cell, rank, results, rendezvous), daemon=True)
        for rank in range(cell.world_size)
    ]
    for proc in procs:
        proc.start()
    records: list[RunRecord] = []
    pending = list(cell.seqlens)
    done: set[int] = set()
    timeout = float(cell.bench["timeout_s"])
    deadline = time.monotonic() + timeout
    failure: tuple[str, str] | None = None
    detail = ""

    def accept(record: RunRecord) -> None:
        records.append(record)
        on_record(record)

    while pending or len(done) < len(procs):
        try:
            msg = results.get(timeout=0.2)
        except queue_mod.Empty:
            msg = None
        if msg is not None:
            kind = msg[0]
            if kind == "record":
                record = RunRecord.from_dict(msg[1])
                if record.seqlen in pending:
                    pending.remove(record.seqlen)
                accept(record)
                deadline = time.monotonic() + timeout
            elif kind == "done":
                done.add(msg[1])
            elif kind == "fatal":
                failure = ("error", f"rank {msg[1]} failed: {msg[2].strip().splitlines()[-1]}")
                detail = msg[2]
                break
            continue
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            failure = _describe_exit(dead[0].exitcode)
            break
        if not pending and all(p.exitcode == 0 for p in procs):
            break
        if time.monotonic() > deadline:
            failure = ("timeout", f"no result within bench.timeout_s={timeout:g} s; workers killed")
            break
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)
    if rendezvous is not None:
        Path(rendezvous).unlink(missing_ok=True)
    if failure is not None and pending:
        status, reason = failure
        current = pending.pop(0)
        record = _failure_record(cell, current, status, reason)
        if detail:
            record.error_msg = detail[-1000:]
        accept(record)
        for seqlen in pending:
            accept(
                _failure_record(
                    cell, seqlen, "skipped", f"not run: seqlen {current} ended in {status}"
                )
            )
    return records
