"""Work items: what a kernel cuts a mask into, and the geometry of their key pieces.

An item is query rows ``[q0, q1)`` of one mask head with the key pieces it attends, each masked
by a band ``lo <= j - i <= hi``, by a stored boolean tile, or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcab.masks.geometry import INF, IntArray


@dataclass(frozen=True)
class WorkItems:
    """Work items as flat arrays: item n owns key pieces ``ptr[n]:ptr[n+1]``.

    A piece attends columns ``[k0, k1)`` for the item's rows where ``lo <= j - i <= hi``
    (global coordinates; ±`INF` for an open edge) and, if ``tile >= 0``, where
    ``tiles[tile][i - q0, j - k0]`` is True. Pieces of an item may come in any order.
    """

    head: IntArray
    q0: IntArray
    q1: IntArray
    ptr: IntArray
    k0: IntArray
    k1: IntArray
    lo: IntArray
    hi: IntArray
    tile: IntArray
    tiles: np.ndarray | None = None

    @property
    def num_items(self) -> int:
        """Number of work items."""
        return len(self.q0)


def pieces_in_order(items: WorkItems, n: int) -> np.ndarray:
    """(m, 7) int64 array of item n's pieces: k0, k1, lo, hi, tile, tile column offset, bind.

    Band pieces are cut into a free middle and binding edges (at most item-height wide).
    """
    a, b = items.ptr[n], items.ptr[n + 1]
    r0, r1 = int(items.q0[n]), int(items.q1[n])
    k0, k1 = items.k0[a:b], items.k1[a:b]
    lo, hi, tile = items.lo[a:b], items.hi[a:b], items.tile[a:b]
    # Every row of the item sees column c when c >= (r1 - 1) + lo and c <= r0 + hi.
    free0 = np.where(lo > -INF, np.clip(r1 - 1 + lo, k0, k1), k0)
    free1 = np.where(hi < INF, np.clip(r0 + hi + 1, k0, k1), k1)
    empty = (free0 >= free1) | (tile >= 0)
    free0 = np.where(empty, k1, free0)
    free1 = np.where(empty, k1, free1)
    parts = []
    for start, stop, bind in ((k0, free0, 1), (free0, free1, 0), (free1, k1, 1)):
        parts.append(np.stack([start, stop, lo, hi, tile, start - k0, np.full_like(k0, bind)], 1))
    out = np.concatenate(parts)
    return out[out[:, 1] > out[:, 0]]


def blocked_mask(
    rows: IntArray, cols: IntArray, sub: np.ndarray, tiles: np.ndarray | None, q0: int
) -> np.ndarray:
    """Bool (len(rows), len(cols)) "masked out" for the columns of sub-pieces ``sub``.

    ``cols`` are the global columns of the concatenated sub-pieces, in order.
    """
    lengths = sub[:, 1] - sub[:, 0]
    owner = np.repeat(np.arange(len(sub)), lengths)
    blocked = np.zeros((len(rows), len(cols)), dtype=bool)
    banded = ((sub[:, 2] > -INF) | (sub[:, 3] < INF))[owner]
    if banded.any():
        diff = cols[None, banded] - rows[:, None]
        lo, hi = sub[owner[banded], 2], sub[owner[banded], 3]
        blocked[:, banded] = (diff < lo[None, :]) | (diff > hi[None, :])
    tiled = sub[owner, 4] >= 0
    if tiles is not None and tiled.any():
        offset = np.arange(len(cols)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        # One tile column per key column (advanced indices on axes 0 and 2 → (n, tile rows)).
        tile_cols = tiles[sub[owner, 4][tiled], :, (sub[owner, 5] + offset)[tiled]]
        blocked[:, tiled] |= ~tile_cols[:, rows - q0].T
    return blocked


def piece_columns(sub: np.ndarray) -> IntArray:
    """Global key columns of sub-pieces, concatenated in order."""
    lengths = sub[:, 1] - sub[:, 0]
    starts = np.repeat(sub[:, 0] - (np.cumsum(lengths) - lengths), lengths)
    return (starts + np.arange(int(lengths.sum()))).astype(np.int64)


def cut_pieces(sub: np.ndarray, c0: int, c1: int) -> np.ndarray:
    """The sub-pieces covering item columns [c0, c1) of the concatenated list ``sub``."""
    lengths = sub[:, 1] - sub[:, 0]
    end = np.cumsum(lengths)
    start = end - lengths
    keep = (end > c0) & (start < c1)
    out = sub[keep].copy()
    trim_lo = np.maximum(c0 - start[keep], 0)
    trim_hi = np.maximum(end[keep] - c1, 0)
    out[:, 0] += trim_lo
    out[:, 5] += trim_lo
    out[:, 1] -= trim_hi
    return out
