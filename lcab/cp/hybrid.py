"""Ulysses inside a group around a ring across groups: what USP and LoongTrain share.

Tokens are placed on R ring shards (by the balancer) and each shard is split contiguously among
the U ranks of a Ulysses group. An all-to-all gives each rank its ring shard for Hq / U heads, a
ring over the R groups (ranks with the same Ulysses position) merges the keys of every shard,
and a final all-to-all returns to sequence sharding. The strategies differ only in the ring's
schedule (plain or windowed) and therefore its traffic, so that is all a subclass says.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from typing_extensions import override

from lcab.cp.base import Plan, Strategy, StrategyOptions
from lcab.cp.prepared import CPPrepared
from lcab.cp.ring import ring_steps
from lcab.cp.ring_attention import RingSpec, Step, ring_attention_function
from lcab.cp.ulysses import a2a_bytes, heads_to_seq, replicate_kv, seq_to_heads
from lcab.distributed.context import DistContext
from lcab.distributed.groups import RingChannels, ring_channels
from lcab.kernels import Kernel, Problem
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


@dataclass
class UlyssesRingOptions(StrategyOptions):
    """Options of the two-dimensional strategies (USP, LoongTrain)."""

    ulysses_degree: int | None = None
    """Ulysses group size; None: the devices of one node (the paper's placement)."""


class UlyssesRing(Strategy):
    """Ulysses (``ulysses_degree``, default: devices per node) x a ring over the groups."""

    options_cls = UlyssesRingOptions

    @override
    def ulysses_degree(self, world: int) -> int:
        degree = self.options.get("ulysses_degree")
        return int(degree) if degree is not None else min(self.devices_per_node, world)

    @override
    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        out = self.ring_volume(plan, problem)
        if plan.ulysses > 1:
            q, kv = a2a_bytes(plan, problem)
            out |= {"a2a": 2 * q + 2 * kv, "a2a_grad": 2 * q + 2 * kv}
        return out

    @abstractmethod
    def ring_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        """Analytic bytes one rank sends around the ring (fwd + bwd), per operation name."""

    @abstractmethod
    def ring_spec(
        self, plan: Plan, ranks: list[int], position: int, channels: RingChannels, steps: list[Step]
    ) -> RingSpec:
        """The ring schedule of ring position ``position`` over global ``ranks``."""

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
        spec = self.ring_spec(plan, grid.my_ring(), grid.ring_index, channels, steps)
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
