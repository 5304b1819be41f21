"""LoongTrain: Ulysses inside a group, a double ring across groups.

As USP, but the ring of R groups is cut into ``window_count`` windows: an inner ring rotates
K/V inside a window while the next window's block is prefetched over the outer ring, spreading
inter-node traffic over more links. In the backward each window's dK/dV accumulator follows its
block to the next window after the inner rotation (the extra synchronisation the paper notes).
Default windows: the largest divisor w of R with w <= R / w (the paper's balanced choice).
"""

from __future__ import annotations

from typing import Any

import torch

from lcab.cp.base import Plan, Strategy, accumulator_bytes, element_bytes, register_strategy
from lcab.cp.prepared import CPPrepared
from lcab.cp.ring import ring_steps
from lcab.cp.rings import DoubleRingAttention, DoubleRingSpec
from lcab.cp.ulysses import a2a_bytes, heads_to_seq, replicate_kv, seq_to_heads
from lcab.dist.groups import balanced_windows
from lcab.kernels import Kernel, Problem
from lcab.masks.core import AttnMask


@register_strategy
class LoongTrain(Strategy):
    """Ulysses x double ring (``window_count`` windows)."""

    name = "loongtrain"
    summary = "Ulysses inside a node x double ring (windows + outer ring with prefetch)"

    def ulysses_degree(self, world: int) -> int:  # noqa: D102
        degree = self.options.get("ulysses_degree")
        return int(degree) if degree is not None else min(self.devices_per_node, world)

    def windows(self, ring: int) -> int:  # noqa: D102
        count = self.options.get("window_count")
        return int(count) if count is not None else balanced_windows(ring)

    def reasons(self, problem: Problem, world: int) -> list[str]:  # noqa: D102
        reasons = super().reasons(problem, world)
        if not reasons:
            ring = world // self.ulysses_degree(world)
            windows = self.windows(ring)
            if windows < 1 or ring % windows:
                reasons.append(f"window_count={windows} does not divide the ring of {ring}")
        return reasons

    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:  # noqa: D102
        out: dict[str, int] = {}
        if plan.ulysses > 1:
            one_way = a2a_bytes(plan, problem, element_bytes(problem))
            out |= {"a2a": one_way, "a2a_grad": one_way}
        w = plan.windows
        s = plan.ring // w
        block = 2 * plan.shard_len * plan.ulysses * plan.heads.local_kv * problem.head_dim
        kv, acc = block * element_bytes(problem), block * accumulator_bytes(problem)
        pairs = {
            "loong_outer_kv": (w - 1) * kv,
            "loong_inner_kv": w * (s - 1) * kv,
            "loong_outer_kv_bwd": (w - 1) * kv,
            "loong_inner_kv_bwd": w * (s - 1) * kv,
            "loong_inner_dkv": w * s * acc if s > 1 else 0,
            "loong_outer_dkv": w * acc if w > 1 else 0,
        }
        return out | {k: v for k, v in pairs.items() if v}

    def build(
        self, plan: Plan, mask: AttnMask, problem: Problem, kernel: Kernel, ctx: Any
    ) -> CPPrepared:
        """The callable of ``ctx.rank``, with every step's kernel prepared."""
        grid = plan.grid(ctx.rank)
        a2a_group, ring_group = grid.create_groups(ctx)
        ring_ranks = grid.my_ring()
        steps = ring_steps(
            plan,
            mask,
            problem,
            kernel,
            grid.ring_index,
            grid.ulysses_index,
            list(plan.placement.layouts),
        )
        spec = DoubleRingSpec(
            ring_ranks,
            grid.ring_index,
            plan.windows,
            ring_group,
            {s.source: s for s in steps},
            "loong",
        )
        u, heads = plan.ulysses, plan.heads

        def run(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
            k, v = replicate_kv(k, heads), replicate_kv(v, heads)
            if u > 1:
                q, k, v = (seq_to_heads(t, a2a_group, u) for t in (q, k, v))
            out, _ = DoubleRingAttention.apply(q, k, v, spec)
            return (heads_to_seq(out, a2a_group, u) if u > 1 else out), None

        return CPPrepared(plan, ctx.rank, run, mask)
