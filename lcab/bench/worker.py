"""The entry point of a worker process: build the target, run the cell, send records back.

Workers start from a forkserver that imported torch and lcab once: milliseconds per rank.
"""

from __future__ import annotations

from typing import Any

import torch

from lcab.bench.console import progress_bar
from lcab.bench.runner import run_cell
from lcab.bench.targets import make_target
from lcab.cell import Cell

THREAD_STACK_BYTES = 1 << 20
"""Stack of each Python thread a rank under a CPU memory budget starts (`apply_memory_budget`)."""

PRELOAD = ("torch", __name__)
"""Modules the local forkserver imports once (this one brings every kernel and strategy)."""


def _threads(cell: Cell) -> int | None:
    threads = cell.bench.threads
    if threads is None and cell.world_size > 1 and cell.device == "cpu":
        return 1  # several ranks share the cores
    return threads


def apply_memory_budget(cell: Cell) -> None:
    """Hold this rank to ``bench.memory_budget_gib`` (a frontier below the device's memory).

    CUDA: the caching allocator's fraction. CPU: ``RLIMIT_DATA`` at what the rank holds now plus
    the budget (past it: "can't allocate memory", ``oom``), with large blocks returned on free
    (`_blocks_returned_on_free`, also in any CPU frontier search) so it counts live tensors.
    """
    budget = cell.bench.memory_budget_gib
    if cell.device == "cpu" and (budget is not None or cell.frontier is not None):
        _blocks_returned_on_free()
    if budget is None:
        return
    if cell.device == "cuda":
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget * 2**30 / total), device)
        return
    import resource
    import threading

    # a thread's stack (8 MiB by default) counts: threads must still start near the budget
    threading.stack_size(THREAD_STACK_BYTES)
    held = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                held = int(line.split()[1]) * 1024
    limit = held + int(budget * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))


MMAP_THRESHOLD_BYTES = 128 << 10
"""Allocations from this size get their own mapping under a CPU budget (glibc's default start)."""


def _blocks_returned_on_free() -> None:
    """Fix glibc's mmap threshold at 128 KiB, so a freed tensor's memory leaves the process.

    glibc's sliding threshold (up to 32 MiB) keeps freed tensors in the heap, so the limit grew
    with history (a 2,432-token frontier of `ranges` instead of 2,944 at 0.2 GiB). No-op
    without ``mallopt`` (musl, macOS).
    """
    import ctypes

    m_mmap_threshold = -3  # glibc's malloc.h
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)


def _first_to_go() -> None:
    """Offer this rank to the out-of-memory killer before the supervisor (``oom_score_adj``)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    except OSError:
        pass  # not Linux, or a sandbox without /proc: the kernel's own choice stands


def worker_main(rank: int, world: int, rendezvous: str, messages: Any, cell: Cell) -> None:
    """Run ``cell`` as ``rank``, sending ("record", dict) messages (`lcab.distributed.launch`)."""
    threads = _threads(cell)
    if threads is not None:
        torch.set_num_threads(threads)
    if cell.bench.memory_budget_gib is not None:
        # start the queue's feeder thread while there is room: a rank at its budget must report
        messages.put(("budget", rank))
    apply_memory_budget(cell)
    _first_to_go()
    target = make_target(cell, rank, rendezvous)
    steps = len(cell.seqlens) * cell.mask_samples * len(cell.bench.passes)
    show = cell.bench.progress and rank == 0
    with progress_bar(steps, f"{cell.kernel}/{cell.cp}/{cell.mask}", show) as report:
        run_cell(cell, target, lambda r: messages.put(("record", r.to_dict())), report)
    target.close()


def run_in_process(cell: Cell, emit: Any) -> None:
    """Run a single-device cell in this process (bench.isolate=false; no hard timeout)."""
    threads = _threads(cell)
    if threads is not None:
        torch.set_num_threads(threads)
    target = make_target(cell, 0, None)
    try:
        run_cell(cell, target, emit)
    finally:
        target.close()
