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

from lcab.cp.base import Plan, accumulator_bytes, element_bytes, register_strategy
from lcab.cp.hybrid import UlyssesRing, UlyssesRingOptions
from lcab.cp.ring_attention import RingSpec, Step
from lcab.distributed.groups import RingChannels, balanced_windows
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

    @override
    def ring_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        w = plan.windows
        s = plan.ring // w
        block = plan.ring_block(problem.head_dim)
        kv, acc = block * element_bytes(problem), block * accumulator_bytes(problem)
        pairs = {
            "loong_outer_kv": (w - 1) * kv,
            "loong_inner_kv": w * (s - 1) * kv,
            "loong_outer_kv_bwd": (w - 1) * kv,
            "loong_inner_kv_bwd": w * (s - 1) * kv,
            "loong_inner_dkv": w * s * acc if s > 1 else 0,
            "loong_outer_dkv": w * acc if w > 1 else 0,
        }
        return {k: v for k, v in pairs.items() if v}

    @override
    def ring_spec(
        self, plan: Plan, ranks: list[int], position: int, channels: RingChannels, steps: list[Step]
    ) -> RingSpec:
        return RingSpec.of_steps(
            ranks,
            position,
            channels,
            steps,
            windows=plan.windows,
            inner="loong_inner",
            outer="loong_outer",
        )
