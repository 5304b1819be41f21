"""Ring P2P (Ring Attention): K/V blocks rotate around all ranks, overlapped with compute.

After R steps every rank has attended its queries to every rank's keys; partial results merge by
log-sum-exp, and the backward rotates K/V again with dK/dV travelling alongside
(`lcab.cp.ring_attention`). Per-step volume is one K/V shard whatever the mask, so masks that
give a step little work (causal, documents) leave the transfer exposed — which is what the
paper measures. It is the ring of `lcab.cp.hybrid` with no Ulysses group (degree 1).
"""

from __future__ import annotations

from typing_extensions import override

from lcab.cp.base import StrategyOptions, register_strategy
from lcab.cp.hybrid import UlyssesRing


@register_strategy
class RingP2P(UlyssesRing):
    """Ring P2P over all ranks."""

    name = "ring"
    summary = "K/V blocks rotate (P2P), compute overlaps the next transfer, LSE merge"
    options_cls = StrategyOptions

    @override
    def ulysses_degree(self, world: int) -> int:
        return 1
