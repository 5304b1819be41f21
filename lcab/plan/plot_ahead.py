"""The planner sweep's plot, drawn in a forked process while Hydra runs the jobs.

A planner sweep knows its rows before its jobs run (the pre-flight predicted them,
`lcab.plan.app.PredictAhead`); importing matplotlib and drawing took ~0.7 s of a 6-7 s command
at its end, on one core while the other was idle. `BackgroundPlot` forks when the sweep starts
and draws those rows; at the end the caller hands it the rows the jobs wrote, and the plot
stands only if they are the rows it drew (else the caller draws it, as without this). Every wait
is bounded: a child that does not finish in time is killed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WAIT_S = 60.0
"""How long `BackgroundPlot.finish` waits for the drawing before it kills it."""


def plotted_values(rows: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What the plot shows of ``rows``: each line's point (mask, strategy, world, forward)."""
    return sorted((r["mask"], r["cp"], r["world"], r["fwd_tflops"]) for r in rows)


class BackgroundPlot:
    """`lcab.plan.figure.plot_scaling` of ``rows`` to ``path``, in a forked child."""

    def __init__(self, rows: Sequence[dict[str, Any]], path: Path, records: str | None) -> None:
        self.path = path
        self.values = plotted_values(rows)
        self.pid: int | None = None
        # a fork copies only the calling thread (a lock another holds would stay held)
        if not rows or not hasattr(os, "fork") or threading.active_count() > 1:
            return
        pid = os.fork()
        if pid:
            self.pid = pid
            return
        code = 1
        try:
            from lcab.plan.figure import plot_scaling

            plot_scaling(list(rows), path, records)
            code = 0
        finally:
            os._exit(code)  # never return into the parent's code or run its exit handlers

    def finish(self, rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
        """``path`` when the child drew exactly ``rows`` there and ended well; else None."""
        if self.pid is None:
            return None
        same = path == self.path and plotted_values(rows) == self.values
        ok = self._wait(kill=not same)
        return path if same and ok and path.exists() else None

    def _wait(self, kill: bool) -> bool:
        """Reap the child (killed first if ``kill`` or late); whether it exited with 0."""
        assert self.pid is not None
        deadline = time.monotonic() + (0.0 if kill else WAIT_S)
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            if time.monotonic() >= deadline:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
                self.pid = None
                return False
            time.sleep(0.01)
