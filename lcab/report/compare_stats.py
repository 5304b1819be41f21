"""One cell's pass in two campaigns: the time ratio NEW/OLD, its 95 % interval, a verdict.

The interval is the Mann–Whitney interval around the Hodges–Lehmann shift of log times
(Hollander & Wolfe, *Nonparametric Statistical Methods*, ch. 4; ``k`` from the normal
approximation with continuity correction): ranks ignore the outliers timings have, it covers at
small repetition counts where a bootstrap of the median does not, and it has no seed, so a gate
answers the same twice (the guide says more). Records without enough repetitions fall back on
the band ``new p20 / old p80`` to ``new p80 / old p20`` (basis ``p20–p80``).
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
