"""The entry point of a worker process: build the target, run the cell, send records back.

Workers start from a forkserver that imported torch and lcab once, so starting a cell's ranks
costs milliseconds, not a fresh interpreter each (and never forks a process whose OpenMP
threads are running).
"""

from __future__ import annotations

from typing import Any

import torch

from lcab.bench.console import progress_bar
from lcab.bench.runner import run_cell
from lcab.bench.targets import make_target
from lcab.cell import Cell

PRELOAD = ("torch", __name__)
"""Modules the local forkserver imports once for every rank it starts (`lcab.distributed.launch`).

This module imports the runner, the targets and through them every kernel and strategy."""


def _threads(cell: Cell) -> int | None:
    threads = cell.bench.threads
    if threads is None and cell.world_size > 1 and cell.device == "cpu":
        return 1  # several ranks share the cores
    return threads


def worker_main(rank: int, world: int, rendezvous: str, messages: Any, cell: Cell) -> None:
    """Run ``cell`` as ``rank``, sending ("record", dict) messages (`lcab.distributed.launch`)."""
    threads = _threads(cell)
    if threads is not None:
        torch.set_num_threads(threads)
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
