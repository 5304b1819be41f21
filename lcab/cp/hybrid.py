"""Ulysses inside a group around a ring across groups: Ring P2P, USP and LoongTrain.

Each of R ring shards is split among the U ranks of a Ulysses group; an all-to-all gives each
rank its ring shard for Hq / U heads, a ring over the groups (`lcab.cp.ring_attention`) merges
every shard's keys, and an all-to-all returns to sequence sharding. The three strategies differ
only in their Ulysses degree, windows and operation names:

* Ring P2P (Ring Attention): no Ulysses group (degree 1); K/V blocks rotate around all ranks,
  one K/V shard a step whatever the mask, so a step with little work (causal, documents) leaves
  its transfer exposed — which is what the paper measures;
* USP: default Ulysses degree the devices of a node, so the all-to-all stays inside it and the
  ring crosses nodes (the paper's placement);
* LoongTrain: as USP, but the ring is cut into ``window_count`` windows, an inner ring rotating
  K/V inside a window while the next window's block is prefetched over the outer ring (default:
  the largest divisor w of R with w <= R / w, the paper's balanced choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from lcab.cp.base import Plan, Strategy, StrategyOptions, register_strategy, step_mask
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
from lcab.distributed.groups import balanced_windows, ring_channels
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
            out, lse = ring_attention_function().apply(q, k, v, spec)
            if u == 1:  # Ring P2P: its rows' LSE as the ring merged them (the numerics check's)
                return out, lse
            return heads_to_seq(out, a2a_group, u), None

        return CPPrepared(plan, dist.rank, run, mask)


@dataclass
class LoongTrainOptions(UlyssesRingOptions):
    """USP's options plus the windows of the double ring."""

    window_count: int | None = None
    """Windows of the double ring; None: the largest divisor w of the ring with w <= ring / w."""


# registered in this order: the strategies' plot colours follow it (`lcab.report.plot_style`)
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


@register_strategy
class RingP2P(UlyssesRing):
    """Ring P2P over all ranks."""

    name = "ring"
    summary = "K/V blocks rotate (P2P), compute overlaps the next transfer, LSE merge"
    options_cls = StrategyOptions

    @override
    def ulysses_degree(self, world: int) -> int:
        return 1


@register_strategy
class USP(UlyssesRing):
    """Ulysses (``ulysses_degree``, default: devices per node) x Ring P2P over the rest."""

    name = "usp"
    summary = "Ulysses inside a node x Ring P2P across nodes"
    inner = "usp_ring"
