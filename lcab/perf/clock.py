"""Wall-clock helpers for the perf commands (host-side work only, no device sync needed)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def median_ms(samples: list[float]) -> float:
    """Median of second samples, in milliseconds."""
    return statistics.median(samples) * 1e3
