"""USP (unified sequence parallelism): Ulysses inside a group, Ring P2P across groups.

The shared Ulysses x ring machinery is `lcab.cp.hybrid`; USP's ring is the plain one. Default
Ulysses degree: the devices of a node, so the heavy all-to-all stays inside it and the ring
crosses nodes (the paper's placement).
"""

from __future__ import annotations

from typing_extensions import override

from lcab.cp.base import Plan, register_strategy
from lcab.cp.hybrid import UlyssesRing
from lcab.cp.ring import ring_bytes
from lcab.cp.ring_attention import RingSpec, Step
from lcab.distributed.groups import RingChannels
from lcab.kernels import Problem


@register_strategy
class USP(UlyssesRing):
    """Ulysses (``ulysses_degree``, default: devices per node) x Ring P2P over the rest."""

    name = "usp"
    summary = "Ulysses inside a node x Ring P2P across nodes"

    @override
    def ring_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        return ring_bytes(plan, problem, "usp_ring")

    @override
    def ring_spec(
        self, plan: Plan, ranks: list[int], position: int, channels: RingChannels, steps: list[Step]
    ) -> RingSpec:
        return RingSpec.of_steps(ranks, position, channels, steps, inner="usp_ring")
