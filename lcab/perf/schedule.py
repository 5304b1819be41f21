"""``python -m lcab.perf schedule``: every strategy's schedule checked at 8 to 96 ranks, timed.

The grid of `lcab.cp.schedule_check` (every strategy x `GRID_MASKS` x `GRID_WORLDS`, fwd and
bwd) dealt over the usable cores, the most expensive first. Target: <= 60 s on 2 cores.
"""

from __future__ import annotations

import time

from lcab.config.fork_map import fork_map, usable_cores
from lcab.cp import STRATEGIES
from lcab.cp.schedule_check import GRID_MASKS, GRID_WORLDS, grid_cell

TARGET_S = 60.0


def _timed(cell: tuple[str, str, int]) -> tuple[float, int, tuple[str, ...]]:
    """(CPU seconds, operations, problems) of one grid cell."""
    start = time.process_time()
    report = grid_cell(*cell)
    return time.process_time() - start, report.operations, report.problems


def run() -> None:
    """Check the grid, print the time per strategy and every problem found."""
    cells = [(s, m, w) for s in STRATEGIES.names() for m in GRID_MASKS for w in GRID_WORLDS]
    cells.sort(key=lambda cell: -cell[2])  # the largest worlds first: round-robin balances
    cores = usable_cores()
    start = time.perf_counter()
    results = dict(zip(cells, fork_map(_timed, cells, cores), strict=True))
    wall = time.perf_counter() - start
    print(f"{'strategy':<16}{'cells':>6}{'CPU s':>8}{'ops at 96':>11}  problems")
    for name in STRATEGIES.names():
        mine = {c: r for c, r in results.items() if c[0] == name}
        at_96 = max(r[1] for c, r in mine.items() if c[2] == max(GRID_WORLDS))
        found = sum(len(r[2]) for r in mine.values())
        cpu = sum(r[0] for r in mine.values())
        print(f"{name:<16}{len(mine):>6}{cpu:>8.1f}{at_96:>11,}  {found}")
    for cell, (_, _, problems) in results.items():
        for problem in problems:
            print(f"{cell}: {problem}")
    verdict = "met" if wall <= TARGET_S else f"missed by {wall - TARGET_S:.0f} s"
    print(
        f"{len(cells)} cells ({len(GRID_MASKS)} masks x worlds {', '.join(map(str, GRID_WORLDS))}, "
        f"fwd+bwd) checked in {wall:.1f} s on {cores} core(s): target <= {TARGET_S:.0f} s {verdict}"
    )
