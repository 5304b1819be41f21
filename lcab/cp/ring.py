"""Ring P2P (Ring Attention): K/V blocks rotate around all ranks, overlapped with compute.

After R steps every rank has attended its queries to every rank's keys; partial results merge by
log-sum-exp, and the backward rotates K/V again with dK/dV travelling alongside
(`lcab.cp.ring_attention`). Per-step volume is one K/V shard whatever the mask, so masks that
give a step little work (causal, documents) leave the transfer exposed — which is what the
paper measures.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lcab.cp.base import (
    Plan,
    Strategy,
    accumulator_bytes,
    element_bytes,
    register_strategy,
    step_mask,
)
from lcab.cp.prepared import CPPrepared
from lcab.cp.ring_attention import RingSpec, Step, ring_attention_function
from lcab.distributed.context import DistContext
from lcab.distributed.groups import ring_channels
from lcab.kernels import Kernel, Problem
from lcab.masks.core import AttnMask


def ring_steps(
    plan: Plan,
    mask: AttnMask,
    problem: Problem,
    kernel: Kernel,
    position: int,
    ulysses_index: int,
    ring_layouts: list[Any],
) -> list[Step]:
    """Steps of ring position p in order: step i uses the block of position (p - i) mod R."""
    rows = ring_layouts[position]
    heads = plan.heads if plan.ulysses > 1 or mask.num_heads > 1 else None
    local = Problem(
        len(rows),
        len(rows),
        plan.heads.local_q,
        plan.heads.local_kv,
        problem.head_dim,
        problem.dtype,
        problem.device,
    )
    steps = []
    for i in range(plan.ring):
        source = (position - i) % plan.ring
        sub = step_mask(mask, rows, ring_layouts[source], heads, ulysses_index)
        steps.append(Step(source, kernel.prepare(sub, local) if sub.num_slices else None))
    return steps


def ring_bytes(plan: Plan, problem: Problem, prefix: str) -> dict[str, int]:
    """K/V and dK/dV bytes one rank sends around a plain ring of the plan's ring degree."""
    r = plan.ring
    if r == 1:
        return {}
    block = plan.ring_block(problem.head_dim)
    kv = (r - 1) * block * element_bytes(problem)
    return {
        f"{prefix}_kv": kv,
        f"{prefix}_kv_bwd": kv,
        f"{prefix}_dkv": r * block * accumulator_bytes(problem),
    }


@register_strategy
class RingP2P(Strategy):
    """Ring P2P over all ranks."""

    name = "ring"
    summary = "K/V blocks rotate (P2P), compute overlaps the next transfer, LSE merge"

    @override
    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        return ring_bytes(plan, problem, "ring")

    def build(
        self, plan: Plan, mask: AttnMask, problem: Problem, kernel: Kernel, dist: DistContext
    ) -> CPPrepared:
        """The callable of ``dist.rank``, with every step's kernel prepared."""
        layouts = list(plan.placement.layouts)
        ranks = list(range(plan.world))
        spec = RingSpec.of_steps(
            ranks,
            dist.rank,
            ring_channels(plan.grid(dist.rank), 1, dist),
            ring_steps(plan, mask, problem, kernel, dist.rank, 0, layouts),
        )

        def run(q: Any, k: Any, v: Any) -> Any:
            return ring_attention_function().apply(q, k, v, spec)

        return CPPrepared(plan, dist.rank, run, mask)
