"""A function over the jobs of a sweep, on every core: forked copies of this process.

Composing (0.1-0.2 s a job) and predicting (up to 1 s at 96 ranks) are independent and
CPU-bound, so `fork_map` deals jobs to forked copies of the process (inheriting imports and
Hydra's state: they start in milliseconds); the parent takes its own share. Results come back
pickled with the worker's compositions (`compose_cache`). A worker that fails, dies or is late
has its share computed by the parent, so errors surface as without workers. Without
``os.fork`` or with one worker, the parent maps everything.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from lcab.config import compose_cache

T = TypeVar("T")
R = TypeVar("R")

#: A worker's answer may take this many times the parent's own share, plus `GRACE_S`, before
#: the parent stops waiting and computes that share itself (the shares are dealt alike).
PATIENCE = 4.0
GRACE_S = 30.0


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


def fork_map(function: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[function(x) for x in items]``, the items dealt round-robin over ``workers`` processes.

    Round-robin: neighbouring jobs of a sweep differ in size, so every share gets some of each.
    """
    global _MAPPING
    workers = min(workers, len(items))
    if workers <= 1 or not hasattr(os, "fork") or threading.active_count() > 1 or _MAPPING:
        # a fork copies only the calling thread: a lock another thread holds stays held in the
        # worker for ever, so a process with threads maps here; so does a map inside a map (its
        # cores are taken: a job's lengths, mapped when the job is alone, are not when the jobs
        # already are)
        return [function(x) for x in items]
    _MAPPING = True
    try:
        return _fork_map(function, items, workers)
    finally:
        _MAPPING = False


_MAPPING = False
"""True while this process (or the process it was forked from) runs a `fork_map`."""


def _fork_map(function: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """`fork_map` with ``workers`` >= 2 processes."""
    shares = [list(range(w, len(items), workers)) for w in range(workers)]
    children = [_spawn(function, items, share) for share in shares[1:]]
    started = time.monotonic()
    results: dict[int, R] = {i: function(items[i]) for i in shares[0]}
    deadline = time.monotonic() + PATIENCE * (time.monotonic() - started) + GRACE_S
    for (pid, fd), share in zip(children, shares[1:], strict=True):
        answer = _collect(pid, fd, deadline)
        if answer is None:
            results.update({i: function(items[i]) for i in share})
            continue
        values, compositions, runtime_named = answer
        compose_cache.adopt(compositions, runtime_named)
        results.update(zip(share, values, strict=True))
    return [results[i] for i in range(len(items))]


def _spawn(function: Callable[[T], R], items: Sequence[T], share: list[int]) -> tuple[int, int]:
    """Fork a worker for ``share``; (its pid, the read end of its pipe)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        return pid, read_fd
    # the worker: never return into the caller's code, never run the parent's exit handlers
    code = 0
    try:
        os.close(read_fd)
        known = compose_cache.keys()
        values = [function(items[i]) for i in share]
        made = compose_cache.entries(exclude=known)
        payload = pickle.dumps((values, made, compose_cache.runtime_named()))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(payload)
    except BaseException:  # the parent redoes the share and meets the error itself
        code = 1
    os._exit(code)


def _collect(
    pid: int, fd: int, deadline: float
) -> tuple[list[Any], dict[Any, Any], set[Any]] | None:
    """The worker's answer, or None if it failed or missed ``deadline``.

    The answer: its values, its compositions and which of them carry the process's job name.
    """
    chunks: list[bytes] = []
    finished = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                finished = True
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    if not finished:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if not finished or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        answer = pickle.loads(b"".join(chunks))
    except Exception:  # a torn payload: the parent redoes the share
        return None
    return answer
