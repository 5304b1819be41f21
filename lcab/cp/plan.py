"""A context-parallel plan as plain data: who holds which tokens, how heads split, what moves.

Computed from the mask alone by `lcab.cp.base.Strategy.plan`; apart from the strategy contract
so that the modules a build uses can read it without importing the contract (no circle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lcab.cp.balance import Placement
from lcab.distributed.groups import Grid
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray


@dataclass(frozen=True)
class HeadSplit:
    """How heads are divided over a Ulysses group (with K/V heads replicated if needed)."""

    heads_q: int
    heads_kv: int
    ulysses: int
    kv_replication: int

    @property
    def local_q(self) -> int:
        """Query heads per rank."""
        return self.heads_q // self.ulysses

    @property
    def local_kv(self) -> int:
        """K/V heads per rank (after replication)."""
        return self.heads_kv * self.kv_replication // self.ulysses

    def kv_heads_of(self, index: int) -> list[int]:
        """Original K/V head of each local K/V head of Ulysses member ``index``."""
        first = index * self.local_kv
        return [(first + i) // self.kv_replication for i in range(self.local_kv)]


def head_split(heads_q: int, heads_kv: int, ulysses: int) -> tuple[HeadSplit | None, str | None]:
    """The head split for a Ulysses degree, or the reason there is none.

    K/V heads are replicated (the paper: "GQA converted to MHA" as far as needed) when the
    degree exceeds or does not divide them: by f = U / gcd(Hkv, U), which keeps each query head
    on the copy of its own K/V head (possible when f divides the GQA group size).
    """
    if heads_q % ulysses:
        return None, f"heads_q={heads_q} is not divisible by the Ulysses degree {ulysses}"
    group = heads_q // heads_kv
    replication = ulysses // int(np.gcd(heads_kv, ulysses))
    if group % replication:
        return None, (
            f"heads_kv={heads_kv} cannot be replicated to a multiple of the Ulysses degree "
            f"{ulysses} while keeping GQA groups of {group} together"
        )
    return HeadSplit(heads_q, heads_kv, ulysses, replication), None


@dataclass(frozen=True)
class Plan:
    """How one cell is split over ranks (plain data)."""

    strategy: str
    world: int
    ulysses: int
    ring: int
    windows: int
    balancer: str
    placement: Placement
    """Shards along the ring dimension (R shards; the world for 1-D strategies)."""
    rank_layouts: tuple[IntArray, ...]
    """Tokens each rank holds at the input and output (sequence-sharded)."""
    heads: HeadSplit
    comm_bytes: dict[str, int] = field(default_factory=dict)
    """Analytic bytes one rank sends in one forward + backward, per operation."""

    @property
    def shard_len(self) -> int:
        """Local tokens per rank (padding included)."""
        return len(self.rank_layouts[0])

    def ring_block(self, head_dim: int) -> int:
        """Elements of the K and V block that travels a ring: a ring shard's tokens, my heads."""
        return 2 * self.shard_len * self.ulysses * self.heads.local_kv * head_dim

    @property
    def padding_tokens(self) -> int:
        """Padding positions over all shards of the ring dimension."""
        return self.placement.padding_tokens

    def imbalance(self, mask: AttnMask) -> float:
        """Max / mean attended area over the ring shards (Ulysses is balanced by heads)."""
        return self.placement.imbalance(mask)

    def grid(self, rank: int) -> Grid:
        """The Ulysses x ring coordinates of ``rank``."""
        return Grid(self.world, self.ulysses, rank)
