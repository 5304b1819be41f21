"""Rank grids of the 2-D strategies: Ulysses groups inside a node, rings across.

Ranks are numbered node-major (rank = node · devices_per_node + local). With a Ulysses degree U
that divides the devices of a node, the Ulysses groups are runs of U consecutive ranks (inside
one node, where all-to-all bandwidth is) and the rings are the ranks with the same position in
their Ulysses group (across nodes) — the placement the paper found best. LoongTrain's double
ring cuts each ring of R ranks into windows of R / w consecutive ring positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lcab.distributed.context import DistContext


@dataclass(frozen=True)
class Grid:
    """Ulysses degree x ring degree over ``world`` ranks, and this rank's coordinates."""

    world: int
    ulysses: int
    rank: int

    @property
    def ring(self) -> int:
        """Ring degree R = world / U."""
        return self.world // self.ulysses

    @property
    def ulysses_index(self) -> int:
        """Position of this rank inside its Ulysses group."""
        return self.rank % self.ulysses

    @property
    def ring_index(self) -> int:
        """Position of this rank on its ring."""
        return self.rank // self.ulysses

    def ulysses_groups(self) -> list[list[int]]:
        """Every Ulysses group (consecutive ranks)."""
        return [list(range(a * self.ulysses, (a + 1) * self.ulysses)) for a in range(self.ring)]

    def rings(self) -> list[list[int]]:
        """Every ring (strided ranks), in ring order."""
        return [[a * self.ulysses + u for a in range(self.ring)] for u in range(self.ulysses)]

    def my_ulysses_group(self) -> list[int]:
        """The Ulysses group of this rank."""
        return self.ulysses_groups()[self.ring_index]

    def my_ring(self) -> list[int]:
        """The ring of this rank."""
        return self.rings()[self.ulysses_index]

    def create_groups(self, dist: DistContext) -> tuple[Any, Any]:
        """(my Ulysses group, my ring group), creating every group of the grid first.

        ``new_group`` must be entered by every rank for every group in the same order, so all
        ranks create all Ulysses groups, then all rings, before picking their own. A group of
        one rank (the ring of pure Ulysses, the Ulysses group of a pure ring) is None: it moves
        nothing, and creating it would still be a split over every rank.
        """
        for group in self.ulysses_groups():
            dist.group(group)
        for ring in self.rings():
            dist.group(ring)
        return dist.group(self.my_ulysses_group()), dist.group(self.my_ring())


def balanced_windows(ring: int) -> int:
    """The paper's LoongTrain default: the largest divisor w of the ring with w <= ring / w."""
    best = 1
    for w in range(1, ring + 1):
        if ring % w == 0 and w * w <= ring:
            best = w
    return best
