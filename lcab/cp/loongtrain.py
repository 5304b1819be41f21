"""LoongTrain: Ulysses inside a group, a double ring across groups.

As USP (`lcab.cp.hybrid`), but the ring of R groups is cut into ``window_count`` windows: an
inner ring rotates K/V inside a window while the next window's block is prefetched over the
outer ring, spreading inter-node traffic over more links. In the backward each window's dK/dV
accumulator follows its block to the next window after the inner rotation (the extra
synchronisation the paper notes). Default windows: the largest divisor w of R with w <= R / w
(the paper's balanced choice).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing_extensions import override

from lcab.cp.base import register_strategy
from lcab.cp.hybrid import UlyssesRing, UlyssesRingOptions
from lcab.distributed.groups import balanced_windows
from lcab.kernels import Problem


@dataclass
class LoongTrainOptions(UlyssesRingOptions):
    """USP's options plus the windows of the double ring."""

    window_count: int | None = None
    """Windows of the double ring; None: the largest divisor w of the ring with w <= ring / w."""


@register_strategy
class LoongTrain(UlyssesRing):
    """Ulysses x double ring (``window_count`` windows)."""

    name = "loongtrain"
    summary = "Ulysses inside a node x double ring (windows + outer ring with prefetch)"
    options_cls = LoongTrainOptions
    inner = "loong_inner"
    outer = "loong_outer"

    @override
    def windows(self, ring: int) -> int:
        count = self.options.get("window_count")
        return int(count) if count is not None else balanced_windows(ring)

    @override
    def reasons(self, problem: Problem, world: int) -> list[str]:
        reasons = super().reasons(problem, world)
        if not reasons:
            ring = world // self.ulysses_degree(world)
            windows = self.windows(ring)
            if windows < 1 or ring % windows:
                reasons.append(f"window_count={windows} does not divide the ring of {ring}")
        return reasons
