"""Rows whose attended keys end on a diagonal, for every (query shard, key shard) pair.

A kernel that cuts its query rows into pieces and gives each piece one contiguous key segment
(lcab's `ranges`, MagiAttention's FFA) computes, where a slice's band bounds the rows (a causal
edge, a sliding window's edges), the whole rectangle of the piece and masks the staircase past
the diagonal afterwards: each run of ``L`` such rows cut into pieces of ``T`` rows computes
about ``T (T - 1) / 2`` masked positions per whole piece. The attended area
(`lcab.plan.areas`) does not see that work, so a rate fitted on causal masks absorbs it and runs
a mask without diagonals (``full``) faster than it says. Here every pair gets the rows of shard
``i`` with a band edge inside shard ``j``'s keys, and the runs they form (consecutive rows of the
shard, consecutive edge keys of the key shard, one slice), from which `lcab.plan.model` costs
the staircase at the kernel's piece height.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, kind_bands


@dataclass(frozen=True)
class DiagonalWork:
    """Band edges of every pair, per mask head."""

    rows: np.ndarray
    """(H_mask, I, J) rows of shard i whose first or last attended key of a slice is set by
    the slice's band and lies in shard j (a row with both edges there counts twice)."""
    runs: np.ndarray
    """(H_mask, I, J) runs of such rows: consecutive in shard i (in its layout's order), their
    edge keys adjacent in shard j, in one slice and on one side of it. A layout laid out back
    to front has none: `lcab.masks.remap` turns it into one slice per position, no band."""


@dataclass(frozen=True)
class _Edges:
    """One head's band edges: (row, edge key) with the slice and side, row-ordered per slice."""

    row: IntArray
    key: IntArray
    group: IntArray
    """Slice index x 2 + side: edges of one group and consecutive rows can form a run."""


def _edges(slices: IntArray) -> _Edges:
    """Every (row, key) where a slice's band, not its key range, ends a row's attended span."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    lo, hi = kind_bands(*s.T)
    counts = s[:, 1] - s[:, 0]
    index = np.repeat(np.arange(len(s)), counts)
    rows = (
        s[index, 0]
        + np.arange(counts.sum(), dtype=np.int64)
        - np.repeat(np.cumsum(counts) - counts, counts)
    )
    first = np.maximum(s[index, 2], rows + lo[index])
    last = np.minimum(s[index, 3] - 1, rows + hi[index])
    held = first <= last
    right = held & (rows + hi[index] < s[index, 3] - 1)
    left = held & (rows + lo[index] > s[index, 2])
    return _Edges(
        row=np.concatenate([rows[right], rows[left]]),
        key=np.concatenate([last[right], first[left]]),
        group=np.concatenate([index[right] * 2, index[left] * 2 + 1]),
    )


def _positions(sets: Sequence[IntArray], length: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """(shard, position in the shard) of every token (-1: none) and whether shards are disjoint."""
    owner = np.full(length, -1, dtype=np.int64)
    place = np.full(length, -1, dtype=np.int64)
    given = 0
    for index, layout in enumerate(sets):
        where = np.flatnonzero(layout >= 0)
        owner[layout[where]] = index
        place[layout[where]] = where
        given += len(where)
    return owner, place, int(np.count_nonzero(owner >= 0)) == given


def _count(
    edges: _Edges,
    rows: tuple[np.ndarray, np.ndarray],
    keys: tuple[np.ndarray, np.ndarray],
    shape: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Edge rows and runs per (row shard, key shard) for token -> (shard, position) tables."""
    i, at_i = rows[0][edges.row], rows[1][edges.row]
    j, at_j = keys[0][edges.key], keys[1][edges.key]
    held = (i >= 0) & (j >= 0)
    i, j, at_i, at_j, group = i[held], j[held], at_i[held], at_j[held], edges.group[held]
    continues = np.zeros(len(i), dtype=bool)
    continues[1:] = (
        (group[1:] == group[:-1])
        & (i[1:] == i[:-1])
        & (j[1:] == j[:-1])
        & (at_i[1:] == at_i[:-1] + 1)
        & (np.abs(at_j[1:] - at_j[:-1]) == 1)
    )
    cells = shape[0] * shape[1]
    flat = i * shape[1] + j
    count = np.bincount(flat, minlength=cells).reshape(shape)
    starts = np.bincount(flat[~continues], minlength=cells).reshape(shape)
    return count.astype(np.float64), starts.astype(np.float64)


def diagonal_work(
    mask: AttnMask, row_sets: Sequence[IntArray], col_sets: Sequence[IntArray]
) -> DiagonalWork:
    """`DiagonalWork` of ``mask`` for query shards ``row_sets`` and key shards ``col_sets``.

    Costs O(rows of the slices) per head. Shards that share tokens are counted pair by pair.
    """
    shape = (len(row_sets), len(col_sets))
    row_table = _positions(row_sets, mask.seqlen_q)
    key_table = _positions(col_sets, mask.seqlen_k)
    rows = np.zeros((mask.num_heads, *shape))
    runs = np.zeros((mask.num_heads, *shape))
    for head in range(mask.num_heads):
        edges = _edges(mask.head_slices(head))
        if row_table[2] and key_table[2]:
            rows[head], runs[head] = _count(edges, row_table[:2], key_table[:2], shape)
            continue
        one_keys = [_positions([col_set], mask.seqlen_k)[:2] for col_set in col_sets]
        for a, row_set in enumerate(row_sets):
            one_row = _positions([row_set], mask.seqlen_q)[:2]
            for b, one_key in enumerate(one_keys):
                got = _count(edges, one_row, one_key, (1, 1))
                rows[head, a, b], runs[head, a, b] = got[0][0, 0], got[1][0, 0]
    return DiagonalWork(rows, runs)
