"""The entry point of a worker process: build the target, run the cell, send records back.

Workers start from a forkserver that imported torch and lcab once, so starting a cell's ranks
costs milliseconds, not a fresh interpreter each (and never forks a process whose OpenMP
threads are running).
"""

from __future__ import annotations

from typing import Any

import torch

from lcab.bench.console import progress_bar
from lcab.bench.runner import KernelTarget, Target, kernel_target, run_cell
from lcab.cell import Cell


def make_target(cell: Cell, rank: int, rendezvous: str | None) -> Target:
    """The target of ``cell`` on ``rank``: the kernel, or a CP strategy around it."""
    if cell.cp == "none":
        return kernel_target(cell)
    from lcab.bench.targets import cp_target  # distributed pieces only when needed

    return cp_target(cell, rank, rendezvous)


def _threads(cell: Cell) -> int | None:
    threads = cell.bench.get("threads")
    if threads is None and cell.world_size > 1 and cell.device == "cpu":
        return 1  # several ranks share the cores
    return int(threads) if threads is not None else None


def worker_main(rank: int, world: int, rendezvous: str, messages: Any, cell: Cell) -> None:
    """Run ``cell`` as ``rank``, sending ("record", dict) messages (`lcab.distributed.launch`)."""
    threads = _threads(cell)
    if threads is not None:
        torch.set_num_threads(threads)
    target = make_target(cell, rank, rendezvous)
    steps = len(cell.seqlens) * cell.mask_samples * len(cell.bench["passes"])
    show = bool(cell.bench.get("progress", True)) and rank == 0
    with progress_bar(steps, f"{cell.kernel}/{cell.cp}/{cell.mask}", show) as report:
        run_cell(cell, target, lambda r: messages.put(("record", r.to_dict())), report)
    close = getattr(target, "close", None)
    if close is not None:
        close()


def run_in_process(cell: Cell, emit: Any) -> None:
    """Run a single-device cell in this process (bench.isolate=false; no hard timeout)."""
    threads = _threads(cell)
    if threads is not None:
        torch.set_num_threads(threads)
    target = kernel_target(cell) if cell.cp == "none" else make_target(cell, 0, None)
    assert isinstance(target, KernelTarget) or cell.world_size == 1
    run_cell(cell, target, emit)
