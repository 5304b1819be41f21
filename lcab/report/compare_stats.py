"""One cell's pass in two campaigns: the time ratio NEW/OLD, its 95 % interval, a verdict.

**The interval is a rank interval, not a bootstrap**: the Hodges–Lehmann estimate of the shift
between the two campaigns' log times (the median of every pairwise difference
``log new_j - log old_i``) with the Mann–Whitney confidence interval around it (Hollander &
Wolfe, *Nonparametric Statistical Methods*, ch. 4: the ``k``-th smallest and largest pairwise
differences, ``k`` from the normal approximation of the U statistic with continuity correction:
the exact distribution's ``k`` at 4 to 20 repetitions a side, one step wider at 40). Why:
timings are skewed and have outliers (a preempted repetition, a clock step), which ranks
ignore; the interval's coverage holds at the small repetition counts benchmarks use, where a
bootstrap of the median is coarse and under-covers; and it has no random seed, so a nightly
gate gives the same answer twice. It assumes what a slowdown is: every repetition scaled by one
factor (a shift of log times).

Each campaign's own spread decides the width: a noisy campaign (or few repetitions) gives a
wide interval, so the same 3 % reads ``slower`` on a quiet GPU and ``within noise`` on a busy
host. Repetitions of one run are treated as independent draws; drift between runs on one
machine (clocks, placement, the 5–9 % that flash-attention#2570 reports between machines of one
model) is not in them — that is what a gate's threshold (``--fail-slower``) is for.

Records from before the repetitions were kept, or with too few of them for a 95 % interval
(3 + 3 cannot give one), fall back on their quantiles: the band ``new p20 / old p80`` to
``new p80 / old p20`` (basis ``p20–p80``, wider than an interval, not a confidence statement).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z_95 = 1.959963984540054
"""The standard normal's 97.5 % quantile: a two-sided 95 % interval."""
BASIS_REPS, BASIS_QUANTILES, BASIS_MEDIANS = "reps", "p20–p80", "p50"


@dataclass(frozen=True)
class PassTimes:
    """What one record says about one pass's time (ms)."""

    p50: float
    p20: float | None = None
    p80: float | None = None
    reps: Sequence[float] | None = None


@dataclass(frozen=True)
class Ratio:
    """NEW/OLD time of one pass (above 1: NEW is slower), with its interval and verdict."""

    ratio: float
    low: float | None
    high: float | None
    basis: str
    """`BASIS_REPS` (the rank interval), `BASIS_QUANTILES` (the band) or `BASIS_MEDIANS` (none)."""

    @property
    def verdict(self) -> str:
        """``slower`` / ``faster`` when the interval (or band) excludes 1, else within noise."""
        if self.low is None or self.high is None:
            return "no spread"
        return "slower" if self.low > 1 else "faster" if self.high < 1 else "within noise"


def rank_interval(old: Sequence[float], new: Sequence[float]) -> Ratio | None:
    """Hodges–Lehmann ratio NEW/OLD with its 95 % Mann–Whitney interval (None: too few reps)."""
    n, m = len(old), len(new)
    k = math.floor(n * m / 2 - 0.5 - Z_95 * math.sqrt(n * m * (n + m + 1) / 12))
    if k < 0 or min(min(old), min(new)) <= 0:
        return None
    diffs = np.sort(np.subtract.outer(np.log(new), np.log(old)), axis=None)
    low, high = float(np.exp(diffs[k])), float(np.exp(diffs[-1 - k]))
    return Ratio(float(np.exp(np.median(diffs))), low, high, BASIS_REPS)


def compare_times(old: PassTimes, new: PassTimes) -> Ratio:
    """The best comparison the two records allow: repetitions, else quantiles, else medians."""
    if old.reps and new.reps:
        found = rank_interval(list(old.reps), list(new.reps))
        if found is not None:
            return found
    ratio = new.p50 / old.p50
    if old.p20 and old.p80 and new.p20 and new.p80:
        return Ratio(ratio, new.p20 / old.p80, new.p80 / old.p20, BASIS_QUANTILES)
    return Ratio(ratio, None, None, BASIS_MEDIANS)
