"""Start a world of local rank processes and watch them: no hang, no strays, failures reported.

`launch` starts ``world`` ranks from a forkserver (torch imported once: a rank starts in
milliseconds and never forks running OpenMP threads). The world ends when every rank is done,
or at the first failure (an exception, a dead rank, the deadline), after which the rest are
killed and joined. No rank outlives the caller either: each holds the read end of a *lifeline*
pipe whose only write end the caller keeps, so however the caller dies the ranks read EOF and exit.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CONTEXT: Any = None
STOP = -1.0
"""Returned by ``on_message`` to end the world early (all ranks are then killed)."""


def context(preload: Sequence[str] = ("torch",)) -> Any:
    """The forkserver context; its server imports ``preload`` once for every rank it starts.

    The first caller's list holds (the server starts with the first world); CPython ignores a
    preload module that fails to import, which is why callers test their lists.
    """
    global _CONTEXT
    if _CONTEXT is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        _CONTEXT = ctx
    return _CONTEXT


@dataclass
class LaunchResult:
    """How a world ended."""

    status: str
    """'done' (every rank finished), 'error' (a rank raised or died), 'timeout' or 'stopped'."""
    reason: str = ""
    detail: str = ""
    exit_codes: tuple[int | None, ...] = ()


def describe_exit(code: int | None) -> str:
    """Words for a process exit code (negative: killed by a signal)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"killed by {name}"
    return f"exited with code {code}"


def guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """Wrap a rank function so an exception becomes a ("fatal", rank, traceback) message."""
    return _Guarded(fn)


LIFELINE_EXIT = 70
"""Exit code of a rank that left because the process that launched it was gone."""


def _follow_lifeline(lifeline: Any) -> None:
    """Exit this rank as soon as the lifeline breaks (nothing is ever sent on it)."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(LIFELINE_EXIT)  # no clean-up: the results have nowhere to go

    threading.Thread(target=watch, name="lcab-lifeline", daemon=True).start()


class _Guarded:
    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn

    def __call__(
        self, rank: int, world: int, rendezvous: str, messages: Any, lifeline: Any, *args: Any
    ) -> None:
        _follow_lifeline(lifeline)
        try:
            self.fn(rank, world, rendezvous, messages, *args)
            messages.put(("done", rank))
        except BaseException:  # report anything, then fail the process
            messages.put(("fatal", rank, traceback.format_exc(limit=8)[-3000:]))
            raise SystemExit(1) from None


def launch(
    fn: Callable[..., None],
    world: int,
    args: tuple[Any, ...],
    timeout_s: float,
    on_message: Callable[[tuple[Any, ...]], float | None],
    rendezvous_dir: str | Path,
    preload: Sequence[str] = ("torch",),
) -> LaunchResult:
    """Run ``guarded(fn)`` on ``world`` ranks until done, a failure or the deadline.

    ``on_message(msg)`` receives every message that is not "done"/"fatal"; it may return a new
    timeout in seconds (from now) — e.g. after each result — or `STOP`. ``preload``: modules
    the forkserver imports once (see `context`).
    """
    ctx = context(preload)
    messages = ctx.Queue()
    lifeline, keep_alive = ctx.Pipe(duplex=False)  # ranks read; only this process can write
    Path(rendezvous_dir).mkdir(parents=True, exist_ok=True)
    rendezvous = str(Path(rendezvous_dir) / f".rendezvous-{uuid.uuid4().hex}")
    procs = [
        ctx.Process(
            target=guarded(fn),
            args=(rank, world, rendezvous, messages, lifeline, *args),
            daemon=True,
        )
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    lifeline.close()  # the ranks hold their own copies
    done: set[int] = set()
    fatal: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    result: LaunchResult | None = None
    all_done = False
    try:
        while len(done) < world:
            try:
                msg = messages.get(timeout=0.1)
            except queue_mod.Empty:
                msg = None
            if msg is not None:
                kind = msg[0]
                if kind == "done":
                    done.add(msg[1])
                elif kind == "fatal":
                    fatal[msg[1]] = msg[2]
                    result = _root_cause(procs, messages, fatal, done)
                    break
                else:
                    new = on_message(msg)
                    if new == STOP:
                        result = LaunchResult("stopped", "stopped by the caller")
                        break
                    if new is not None:
                        deadline = time.monotonic() + new
                continue
            dead = [
                (r, p.exitcode)
                for r, p in enumerate(procs)
                if p.exitcode not in (None, 0) and r not in done
            ]
            if dead:
                result = _root_cause(procs, messages, fatal, done)
                break
            if time.monotonic() > deadline:
                result = LaunchResult("timeout", f"no progress within {timeout_s:g} s")
                break
        all_done = result is None
    finally:
        # every rank said done: let them exit on their own (briefly); on a failure, or when
        # the caller is unwinding (Ctrl-C, SIGTERM), kill them now
        if all_done:
            end = time.monotonic() + 10.0
            for proc in procs:
                proc.join(timeout=max(0.0, end - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=10)
        keep_alive.close()
        Path(rendezvous).unlink(missing_ok=True)
    codes = tuple(p.exitcode for p in procs)
    if result is None:
        result = LaunchResult("done")
    result.exit_codes = codes
    return result


PEER_SYMPTOMS = ("Connection closed", "Connection reset", "Broken pipe", "peer", "aborted")
"""Words of errors a rank sees because *another* rank failed (gloo/NCCL transport errors)."""


def _root_cause(
    procs: list[Any], messages: Any, fatal: dict[int, str], done: set[int], grace_s: float = 1.0
) -> LaunchResult:
    """Name the failure that started it all, not its echoes on the peers.

    Peers of a dead rank fail moments later with transport errors, often first in the queue:
    so after a short grace period prefer a rank's own exception that is not a peer symptom,
    else a rank that died without a word, else the first exception seen.
    """
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        try:
            msg = messages.get(timeout=0.05)
        except queue_mod.Empty:
            if all(not p.is_alive() or r in fatal for r, p in enumerate(procs)):
                break
            continue
        if msg[0] == "fatal":
            fatal[msg[1]] = msg[2]
        elif msg[0] == "done":
            done.add(msg[1])
    silent = [
        (r, p.exitcode)
        for r, p in enumerate(procs)
        if p.exitcode not in (None, 0) and r not in fatal and r not in done
    ]
    own = [(r, tb) for r, tb in fatal.items() if not any(w in tb for w in PEER_SYMPTOMS)]
    echoes = sorted(r for r in fatal if r not in dict(own))
    also = f" (then rank(s) {', '.join(map(str, echoes))} lost their peer)" if echoes else ""
    if own:
        rank, tb = own[0]
        return LaunchResult("error", f"rank {rank} failed: {_last_line(tb)}{also}", tb)
    if silent:
        rank, code = silent[0]
        detail = fatal[echoes[0]] if echoes else ""
        return LaunchResult("error", f"rank {rank} {describe_exit(code)}{also}", detail)
    rank = min(fatal)
    return LaunchResult("error", f"rank {rank} failed: {_last_line(fatal[rank])}", fatal[rank])


def _last_line(tb: str) -> str:
    lines = tb.strip().splitlines()
    return lines[-1] if lines else "failed"
