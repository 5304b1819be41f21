"""Rank grids of the 2-D strategies: Ulysses groups inside a node, rings across.

Ranks are numbered node-major (rank = node · devices_per_node + local). With a Ulysses degree U
that divides the devices of a node, the Ulysses groups are runs of U consecutive ranks (inside
one node, where all-to-all bandwidth is) and the rings are the ranks with the same position in
their Ulysses group (across nodes) — the placement the paper found best. LoongTrain's double
ring cuts each ring of R ranks into windows of R / w consecutive ring positions.

A ring's transfers run on their own groups (`RingChannels`): the inner ring (a window), the
outer ring (the same slot of every window) and, for each, a twin that carries only the dK/dV
accumulators. A process group is one NCCL communicator with its own stream, and NCCL runs one
communicator's operations in order, so on one group the next window's K/V prefetch would wait
for the inner ring's transfers, and a step's K/V for the previous step's accumulator. InternEvo
(LoongTrain) likewise keeps inter-window, intra-window and dK/dV groups apart.
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


@dataclass(frozen=True)
class RingChannels:
    """The groups one ring position sends on (None: a group of one rank, never used)."""

    inner: Any
    """K/V around the window (the whole ring when there is one window)."""
    inner_dkv: Any
    """dK/dV accumulators around the window."""
    outer: Any = None
    """K/V from window to window (LoongTrain)."""
    outer_dkv: Any = None
    """dK/dV accumulators from window to window (LoongTrain)."""


def ring_channels(grid: Grid, windows: int, dist: DistContext) -> RingChannels:
    """The `RingChannels` of ``grid``'s rank, creating every ring's groups on every rank in order.

    Order: the K/V groups of every ring (each ring: its windows' inner groups, then its slots'
    outer groups), then the same again as dK/dV twins (tagged, so a twin of the world is a
    group of its own). The K/V groups are the plain ones: a one-window ring's inner group is
    the ring group `create_groups` made (or the world), not a new one.
    """
    size = grid.ring // windows
    mine: dict[str, Any] = {}
    for tag in ("kv", "dkv"):
        for index, ring in enumerate(grid.rings()):
            inner = [ring[w * size : (w + 1) * size] for w in range(windows)]
            outer = [[ring[w * size + slot] for w in range(windows)] for slot in range(size)]
            label = "" if tag == "kv" else tag
            made_inner = [dist.group(ranks, label) for ranks in inner]
            made_outer = [dist.group(ranks, label) for ranks in outer]
            if index == grid.ulysses_index:
                window, slot = divmod(grid.ring_index, size)
                suffix = "" if tag == "kv" else "_dkv"
                mine["inner" + suffix] = made_inner[window]
                mine["outer" + suffix] = made_outer[slot]
    return RingChannels(**mine)


def balanced_windows(ring: int) -> int:
    """The paper's LoongTrain default: the largest divisor w of the ring with w <= ring / w."""
    best = 1
    for w in range(1, ring + 1):
        if ring % w == 0 and w * w <= ring:
            best = w
    return best
