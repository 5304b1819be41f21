"""USP (unified sequence parallelism): Ulysses inside a group, Ring P2P across groups.

The shared Ulysses x ring machinery is `lcab.cp.hybrid`; USP's ring is the plain one. Default
Ulysses degree: the devices of a node, so the heavy all-to-all stays inside it and the ring
crosses nodes (the paper's placement).
"""

from __future__ import annotations

from lcab.cp.base import register_strategy
from lcab.cp.hybrid import UlyssesRing


@register_strategy
class USP(UlyssesRing):
    """Ulysses (``ulysses_degree``, default: devices per node) x Ring P2P over the rest."""

    name = "usp"
    summary = "Ulysses inside a node x Ring P2P across nodes"
    inner = "usp_ring"
