"""CPU execution helpers of the tiled engine: coarse-grained worker threads and scratch memory.

On shared cores each intra-op barrier stalls on a descheduled thread (2 intra-op threads ran a
call 4x slower than 1 on 2 loaded cores), so batches are split across single-threaded workers
with one join per wave. A per-thread reusable scratch avoids page-faulting in fresh score
matrices on every call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


T = TypeVar("T")

_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()
_LOCAL = threading.local()


def _single_threaded() -> None:
    """Worker initializer: this thread's torch ops use one intra-op thread."""
    torch.get_num_threads()  # trigger torch's lazy per-thread init first, so ours sticks
    torch.set_num_threads(1)


def _pool(workers: int) -> ThreadPoolExecutor:
    """A started pool of ``workers`` single-threaded workers (one per size and process).

    Keyed by pid too: a forked child inherits the pool object but not its threads.
    """
    key = (os.getpid(), workers)
    with _POOL_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            keep = torch.get_num_threads()
            pool = ThreadPoolExecutor(
                workers, thread_name_prefix="lcab-tiled", initializer=_single_threaded
            )
            barrier = threading.Barrier(workers)
            list(pool.map(lambda _: barrier.wait(), range(workers)))  # start them all now
            torch.set_num_threads(keep)  # the workers' call also changed the process default
            _POOLS[key] = pool
    return pool


def worker_count(device: torch.device) -> int:
    """How many workers a call uses: the intra-op thread budget on CPU, 1 elsewhere."""
    return max(1, torch.get_num_threads()) if device.type == "cpu" else 1


@contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (restored even on error)."""
    keep = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(keep)


def run_parallel(task: Callable[[int], T], workers: int) -> list[T]:
    """``[task(0), ..., task(workers - 1)]``, concurrently on single-threaded workers.

    Grad mode is thread-local in torch, so the caller's is carried into the workers.
    """
    if workers <= 1:
        return [task(0)]
    grad = torch.is_grad_enabled()

    def run(i: int) -> T:
        with torch.set_grad_enabled(grad):
            return task(i)

    pool = _pool(workers)
    with intra_op_threads(1):  # BLAS thread settings are process-wide: keep them at 1 too
        futures = [pool.submit(run, i) for i in range(workers)]
        return [f.result() for f in futures]


def run_queue(items: Sequence[T], work: Callable[[T, int], None], workers: int) -> list[int]:
    """``work(item, worker)`` for every item, workers pulling from one shared queue.

    Pulling balances itself where a static split idles when another process steals a core.
    """
    lock = threading.Lock()
    order = iter(range(len(items)))

    def loop(worker: int) -> int:
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return worker
            work(items[i], worker)

    return run_parallel(loop, workers)


def scratch(slot: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reusable flat buffer of at least ``numel`` elements, private to the calling thread."""
    cache: dict[tuple[str, torch.dtype, torch.device], torch.Tensor]
    cache = getattr(_LOCAL, "buffers", None) or {}
    _LOCAL.buffers = cache
    key = (slot, dtype, device)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        cache[key] = buf
    return buf[:numel]
