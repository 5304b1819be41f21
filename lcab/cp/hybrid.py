"""Ulysses inside a group around a ring across groups: what Ring P2P, USP and LoongTrain share.

Tokens are placed on R ring shards (by the balancer) and each shard is split contiguously among
the U ranks of a Ulysses group. An all-to-all gives each rank its ring shard for Hq / U heads, a
ring over the R groups (ranks with the same Ulysses position) merges the keys of every shard,
and a final all-to-all returns to sequence sharding. The strategies differ only in the Ulysses
degree (Ring P2P: 1, no all-to-all) and the ring's windows and operation names, so that is all
a subclass says; the ring's schedule is `lcab.cp.ring_attention`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from lcab.cp.base import Plan, Strategy, StrategyOptions, step_mask
from lcab.cp.prepared import CPPrepared
from lcab.cp.ring_attention import (
    RingSpec,
    Step,
    ring_attention_function,
    ring_buffers,
    ring_bytes,
    ring_schedule,
)
from lcab.cp.stages import Pricer, Window
from lcab.cp.ulysses import a2a_bytes, heads_to_seq, replicate_kv, seq_to_heads, ulysses_ends
from lcab.distributed.context import DistContext
from lcab.distributed.groups import ring_channels
from lcab.kernels import Kernel, Problem
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


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


@dataclass
class UlyssesRingOptions(StrategyOptions):
    """Options of the two-dimensional strategies (USP, LoongTrain)."""

    ulysses_degree: int | None = None
    """Ulysses group size; None: the devices of one node (the paper's placement)."""


class UlyssesRing(Strategy):
    """Ulysses (``ulysses_degree``, default: devices per node) x a ring over the groups."""

    options_cls: ClassVar[type] = UlyssesRingOptions
    inner: ClassVar[str] = "ring"
    """The ring's operations: ``{inner}_kv``, ``{inner}_kv_bwd``, ``{inner}_dkv`` inside a
    window, the same on ``outer`` between windows (`RingSpec`)."""
    outer: ClassVar[str] = "ring_outer"

    @override
    def ulysses_degree(self, world: int) -> int:
        degree = self.options.get("ulysses_degree")
        return int(degree) if degree is not None else min(self.devices_per_node, world)

    @override
    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        out = ring_bytes(plan, problem, self.inner, self.outer)
        if plan.ulysses > 1:
            q, kv = a2a_bytes(plan, problem)
            out |= {"a2a": 2 * q + 2 * kv, "a2a_grad": 2 * q + 2 * kv}
        return out

    @override
    def schedule(
        self, plan: Plan, problem: Problem, rank: int, bwd: bool, price: Pricer
    ) -> list[Window]:
        windows = ring_schedule(plan, problem, rank, bwd, price, self.inner, self.outer)
        if plan.ulysses == 1:
            return windows
        before, after = ulysses_ends(plan, problem, rank, bwd, price)
        return [Window((before,)), *windows, Window((after,))]

    @classmethod
    @override
    def buffers(cls, plan: Plan, problem: Problem, backward: bool) -> dict[str, float]:
        return super().buffers(plan, problem, backward) | ring_buffers(plan, problem, backward)

    def build(
        self, plan: Plan, mask: AttnMask, problem: Problem, kernel: Kernel, dist: DistContext
    ) -> CPPrepared:
        """The callable of ``dist.rank``, with every step's kernel prepared."""
        grid = plan.grid(dist.rank)
        a2a_group, _ = grid.create_groups(dist)
        channels = ring_channels(grid, plan.windows, dist)
        steps = ring_steps(
            plan,
            mask,
            problem,
            kernel,
            grid.ring_index,
            grid.ulysses_index,
            list(plan.placement.layouts),
        )
        spec = RingSpec.of_steps(
            grid.my_ring(), grid.ring_index, channels, steps, windows=plan.windows,
            inner=self.inner, outer=self.outer,
        )  # fmt: skip
        u, heads = plan.ulysses, plan.heads

        def run(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
            k, v = replicate_kv(k, heads), replicate_kv(v, heads)
            if u > 1:
                q, k, v = (seq_to_heads(t, a2a_group, u) for t in (q, k, v))
            out, _ = ring_attention_function().apply(q, k, v, spec)
            return (heads_to_seq(out, a2a_group, u) if u > 1 else out), None

        return CPPrepared(plan, dist.rank, run, mask)
