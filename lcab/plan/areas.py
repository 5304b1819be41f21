"""Exact work of every (query shard, key shard) pair of a mask, without building a sub-mask.

A context-parallel step computes the queries of one shard against the keys of another; its cost
is the attended area of that rectangle of the mask (and how long its rows are). The runner finds
each step's area by restricting the mask (`lcab.masks.remap`) — fine for one rank, too slow for
a planner that replays 96 ranks × 96 steps in a second. Here every query row's attended key
spans are counted against a prefix count of each key shard's tokens, so all pairs of one key
shard cost one pass over the rows: O(rows × shards) for the whole matrix, exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, row_spans


@dataclass(frozen=True)
class PairWork:
    """Work of every (query shard i, key shard j) pair, per mask head."""

    area: np.ndarray
    """(H_mask, I, J) attended (query, key) positions."""
    rows: np.ndarray
    """(H_mask, I, J) query rows of shard i with at least one key in shard j."""
    runs: np.ndarray
    """(H_mask, I, J) runs of consecutive such rows (cut at shard and document edges): the
    query tiles a kernel starts, each padded to its tile height."""

    cols: np.ndarray | None = None
    """(H_mask, I, J) key columns of shard j that some row of shard i attends (for the
    backward, whose kernels hold a key tile and sweep the queries that attend it)."""

    @cached_property
    def mean_keys(self) -> np.ndarray:
        """(H_mask, I, J) keys per active row: the length of the rows a kernel call gets."""
        return np.divide(self.area, self.rows, out=np.zeros(self.area.shape), where=self.rows > 0)

    @cached_property
    def mean_queries(self) -> np.ndarray:
        """(H_mask, I, J) queries per attended key column (zeros without ``cols``)."""
        if self.cols is None:
            return np.zeros(self.area.shape)
        return np.divide(self.area, self.cols, out=np.zeros(self.area.shape), where=self.cols > 0)


def owners(layouts: Sequence[IntArray], length: int) -> IntArray:
    """Shard of every token (-1: held by none); layouts hold token ids, -1 for padding."""
    owner = np.full(length, -1, dtype=np.int64)
    for index, layout in enumerate(layouts):
        tokens = layout[layout >= 0]
        owner[tokens] = index
    return owner


def pair_work(
    mask: AttnMask,
    row_sets: Sequence[IntArray],
    col_sets: Sequence[IntArray],
    with_cols: bool = True,
) -> PairWork:
    """`PairWork` of ``mask`` for query shards ``row_sets`` and key shards ``col_sets``.

    Shards are arrays of token ids (-1 = padding, which attends and is attended by nothing).
    ``with_cols`` also counts the attended key columns (from the transposed mask).
    """
    work = _row_work(mask, row_sets, col_sets)
    if with_cols:
        if mask.seqlen_q != mask.seqlen_k:
            raise ValueError("pair_work(with_cols=True) needs a self-attention mask")
        cols = _row_work(mask.transpose(), col_sets, row_sets).rows.transpose(0, 2, 1)
        work = dataclasses.replace(work, cols=cols)
    return work


def _row_work(
    mask: AttnMask, row_sets: Sequence[IntArray], col_sets: Sequence[IntArray]
) -> PairWork:
    """Area, active rows and runs of every (row shard, column shard) pair."""
    n_i, n_j = len(row_sets), len(col_sets)
    row_owner = owners(row_sets, mask.seqlen_q)
    area = np.zeros((mask.num_heads, n_i, n_j))
    rows = np.zeros((mask.num_heads, n_i, n_j))
    runs = np.zeros((mask.num_heads, n_i, n_j))
    docs = (
        np.repeat(np.arange(len(mask.doc_lengths)), mask.doc_lengths)
        if mask.doc_lengths is not None and len(mask.doc_lengths) and mask.seqlen_q == mask.seqlen_k
        else np.zeros(mask.seqlen_q, dtype=np.int64)
    )
    counts = [_prefix_count(layout, mask.seqlen_k) for layout in col_sets]
    for head in range(mask.num_heads):
        row, first, last = row_spans(mask.head_slices(head))
        owner = row_owner[row]
        held = owner >= 0
        row, first, last, owner = row[held], first[held], last[held], owner[held]
        # rows with several spans (shared questions, prefixes) are merged per row for `rows`
        unique_rows, span_row = np.unique(row, return_inverse=True)
        unique_owner = row_owner[unique_rows]
        for j, prefix in enumerate(counts):
            inside = (prefix[last + 1] - prefix[first]).astype(np.float64)
            area[head, :, j] = np.bincount(owner, weights=inside, minlength=n_i)
            per_row = np.bincount(span_row.reshape(-1), weights=inside, minlength=len(unique_rows))
            active = per_row > 0
            rows[head, :, j] = np.bincount(unique_owner, weights=active, minlength=n_i)
            r, o = unique_rows[active], unique_owner[active]
            start = np.ones(len(r), dtype=bool)
            start[1:] = (r[1:] != r[:-1] + 1) | (o[1:] != o[:-1]) | (docs[r[1:]] != docs[r[:-1]])
            runs[head, :, j] = np.bincount(o[start], minlength=n_i)
    return PairWork(area, rows, runs)


def _prefix_count(layout: IntArray, length: int) -> IntArray:
    """prefix[x] = tokens of ``layout`` below position x (length + 1 entries)."""
    held = np.zeros(length + 1, dtype=np.int64)
    held[layout[layout >= 0] + 1] = 1
    return np.cumsum(held)
