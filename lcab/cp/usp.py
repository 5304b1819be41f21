"""USP (unified sequence parallelism): Ulysses inside a group, Ring P2P across groups.

Tokens are first placed on R ring shards (by the balancer); each shard is split contiguously
among the U ranks of a Ulysses group. The all-to-all gives each rank its ring shard for Hq / U
heads; a ring over the R groups (ranks with the same Ulysses position) then merges the keys of
every shard; a final all-to-all returns to sequence sharding. Default U: the devices of a node,
so the heavy all-to-all stays inside it and the ring crosses nodes (the paper's placement).
"""

from __future__ import annotations

from typing import Any

import torch

from lcab.cp.base import Plan, Strategy, element_bytes, register_strategy
from lcab.cp.prepared import CPPrepared
from lcab.cp.ring import ring_bytes, ring_steps
from lcab.cp.rings import RingAttention, RingSpec
from lcab.cp.ulysses import a2a_bytes, heads_to_seq, replicate_kv, seq_to_heads
from lcab.kernels import Kernel, Problem
from lcab.masks.core import AttnMask


@register_strategy
class USP(Strategy):
    """Ulysses (``ulysses_degree``, default: devices per node) x ring over the rest."""

    name = "usp"
    summary = "Ulysses inside a node x Ring P2P across nodes"

    def ulysses_degree(self, world: int) -> int:  # noqa: D102
        degree = self.options.get("ulysses_degree")
        return int(degree) if degree is not None else min(self.devices_per_node, world)

    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:  # noqa: D102
        out = ring_bytes(plan, problem, "usp_ring")
        if plan.ulysses > 1:
            one_way = a2a_bytes(plan, problem, element_bytes(problem))
            out |= {"a2a": one_way, "a2a_grad": one_way}
        return out

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
        spec = RingSpec(ring_ranks, grid.ring_index, ring_group, steps, "usp_ring")
        u, heads = plan.ulysses, plan.heads

        def run(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
            k, v = replicate_kv(k, heads), replicate_kv(v, heads)
            if u > 1:
                q, k, v = (seq_to_heads(t, a2a_group, u) for t in (q, k, v))
            out, _ = RingAttention.apply(q, k, v, spec)
            return (heads_to_seq(out, a2a_group, u) if u > 1 else out), None

        return CPPrepared(plan, ctx.rank, run, mask)
