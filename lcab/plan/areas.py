"""Exact work of every (query shard, key shard) pair of a mask, without building a sub-mask.

Restricting the mask per step (`lcab.masks.remap`, as the runner does) is too slow for a
replay of 96 ranks × 96 steps. Each head is counted from chunks of the layouts
(`lcab.plan.areas_chunks`, O(segments × shards)), and row by row against a prefix count of each
key shard (O(rows × shards), seconds at 786,432 tokens) only where the chunks cannot stand for
the rows. Both give the same integers; the row count is the definition (`_row_work`,
``fast=False``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, row_spans
from lcab.plan import areas_chunks
from lcab.plan.areas_chunks import Shards
from lcab.plan.areas_diagonal import diagonal_work


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
    col_docs: np.ndarray | None = None
    """(H_mask, I, J) documents with such a column: the sequences a varlen call has work in."""
    longest_cols: np.ndarray | None = None
    """(H_mask, I, J) attended columns of the document that has the most: a varlen backward
    sizes its grid by this longest key sequence (``max_seqlen_k``) for every sequence."""
    diagonal_rows: np.ndarray | None = None
    """(H_mask, I, J) rows of shard i with a band edge (a diagonal) in shard j: where a kernel
    that masks after computing whole pieces does work outside the area
    (`lcab.plan.areas_diagonal`)."""
    diagonal_runs: np.ndarray | None = None
    """(H_mask, I, J) runs of such rows (each cut into pieces of the kernel's height)."""

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


def pair_work(
    mask: AttnMask,
    row_sets: Sequence[IntArray],
    col_sets: Sequence[IntArray],
    with_cols: bool = True,
    diagonal: bool = True,
) -> PairWork:
    """`PairWork` of ``mask`` for query shards ``row_sets`` and key shards ``col_sets``.

    Shards are arrays of token ids (-1 = padding, which attends and is attended by nothing).
    ``with_cols`` also counts the attended key columns (from the transposed mask), per pair
    and per document; ``diagonal`` the rows a band edge ends inside each pair
    (`lcab.plan.areas_diagonal`; without it ``diagonal_rows`` and ``diagonal_runs`` are None).
    """
    if with_cols and mask.seqlen_q != mask.seqlen_k:
        raise ValueError("pair_work(with_cols=True) needs a self-attention mask")
    rows = Shards.of(row_sets, mask.seqlen_q)
    same = col_sets is row_sets and mask.seqlen_q == mask.seqlen_k
    cols = rows if same else Shards.of(col_sets, mask.seqlen_k)
    work = _row_work(mask, row_sets, col_sets, shards=(rows, cols))
    if diagonal:
        edges = diagonal_work(mask, row_sets, col_sets)
        work = dataclasses.replace(work, diagonal_rows=edges.rows, diagonal_runs=edges.runs)
    if with_cols:
        lengths = mask.doc_lengths if mask.doc_lengths is not None else [mask.seqlen_q]
        keys = _row_work(
            mask.transpose(),
            col_sets,
            row_sets,
            np.asarray(lengths),
            shards=(cols, rows),
            with_area=False,
        )
        assert keys.col_docs is not None and keys.longest_cols is not None
        work = dataclasses.replace(
            work,
            cols=keys.rows.transpose(0, 2, 1),
            col_docs=keys.col_docs.transpose(0, 2, 1),
            longest_cols=keys.longest_cols.transpose(0, 2, 1),
        )
    return work


#: Key shards counted together: bounds each (shards x spans) block to 2**23 elements.
_BLOCK_ELEMENTS = 1 << 23


def _row_work(
    mask: AttnMask,
    row_sets: Sequence[IntArray],
    col_sets: Sequence[IntArray],
    per_doc: IntArray | None = None,
    shards: tuple[Shards, Shards] | None = None,
    with_area: bool = True,
    fast: bool = True,
) -> PairWork:
    """Area, active rows and runs of every (row shard, column shard) pair.

    Each head from the chunks, else row by row (`_Reference.head`). ``per_doc`` (document
    lengths, which a transposed mask does not
    carry) also counts, per pair, the documents with active rows and the active rows of the
    document with the most (returned in ``col_docs`` and ``longest_cols``: the caller passes
    the transposed mask, whose rows are key columns). ``shards``: the chunks of ``row_sets``
    and ``col_sets`` (`Shards.of`), where the caller already has them. ``with_area=False``
    leaves ``area`` and ``runs`` zero: the transposed pass of `pair_work` reads only the rows
    and documents, and the chunks then skip the area's product with the token table.
    ``fast=False`` counts every head row by row: the definition the chunks must match.
    """
    if shards is None:
        shards = (Shards.of(row_sets, mask.seqlen_q), Shards.of(col_sets, mask.seqlen_k))
    rows_of, keys_of = shards
    n_i, n_j = rows_of.count, keys_of.count
    shape = (mask.num_heads, n_i, n_j)
    area, rows, runs = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    counting = per_doc is not None
    doc_count = np.zeros(shape) if counting else None
    longest = np.zeros(shape) if counting else None
    lengths = per_doc if counting else mask.doc_lengths
    with_docs = lengths is not None and len(lengths) > 0 and mask.seqlen_q == mask.seqlen_k
    doc_ends = np.cumsum(lengths) if with_docs and lengths is not None else np.zeros(0, np.int64)
    # documents that end early leave rows without one: the row-by-row count raises there
    fast = fast and (not with_docs or doc_ends[-1] >= mask.seqlen_q)
    reference: _Reference | None = None
    for head in range(mask.num_heads):
        slices = mask.head_slices(head)
        got = None
        if fast:
            got = areas_chunks.head_work(
                slices, rows_of, keys_of, doc_ends[:-1], counting, with_area
            )
        if got is None:
            if reference is None:
                reference = _Reference.of(rows_of.owner, col_sets, mask.seqlen_k, doc_ends, n_i)
            got = reference.head(slices, counting)
        rows[head] = got.rows
        if with_area:
            area[head], runs[head] = got.area, got.runs
        if doc_count is not None and longest is not None:
            assert got.col_docs is not None and got.longest_cols is not None
            doc_count[head], longest[head] = got.col_docs, got.longest_cols
    return PairWork(area, rows, runs, col_docs=doc_count, longest_cols=longest)


@dataclass(frozen=True)
class _Reference:
    """The row-by-row count of one call's heads (prefix counts of every key shard)."""

    row_owner: np.ndarray
    docs: IntArray
    prefix: np.ndarray
    n_rows: int

    @classmethod
    def of(
        cls,
        row_owner: np.ndarray,
        col_sets: Sequence[IntArray],
        length: int,
        doc_ends: IntArray,
        n_rows: int,
    ) -> _Reference:
        """Tables of one call: a row's document and the key shards' prefix counts."""
        lengths = np.diff(doc_ends, prepend=0)
        docs = (
            np.repeat(np.arange(len(lengths)), lengths)
            if len(lengths)
            else np.zeros(len(row_owner), dtype=np.int64)
        )
        return cls(row_owner, docs, _prefix_counts(col_sets, length), n_rows)

    def head(self, slices: IntArray, counting: bool) -> areas_chunks.HeadWork:
        """One head's tables, counted row by row.

        Spans are sorted by (row shard, row) once, so every row shard's sum is one contiguous
        segment (`_group_sums`); column shards are handled a block at a time as 2-D arrays
        (shards x spans) instead of one pass per shard.
        """
        prefix, docs, n_i = self.prefix, self.docs, self.n_rows
        n_j = len(prefix)
        area, rows, runs = np.zeros((n_i, n_j)), np.zeros((n_i, n_j)), np.zeros((n_i, n_j))
        doc_count = np.zeros((n_i, n_j)) if counting else None
        longest = np.zeros((n_i, n_j)) if counting else None
        row, first, last = row_spans(slices)
        owner = self.row_owner[row]
        held = owner >= 0
        row, first, last, owner = row[held], first[held], last[held], owner[held]
        if len(row) == 0:
            return areas_chunks.HeadWork(area, rows, runs, doc_count, longest)
        shard_ids = np.arange(n_i + 1)
        order = np.lexsort((row, owner))
        row, first, last, owner = row[order], first[order], last[order], owner[order]
        # a row with several spans (shared questions, prefixes) counts once in `rows` and `runs`
        new_row = np.ones(len(row), dtype=bool)
        new_row[1:] = row[1:] != row[:-1]
        row_starts = np.flatnonzero(new_row)
        unique_rows, unique_owner = row[row_starts], owner[row_starts]
        # the previous unique row continues this one's run: consecutive, same shard, same doc
        link = np.zeros(len(unique_rows), dtype=bool)
        link[1:] = (
            (unique_rows[1:] == unique_rows[:-1] + 1)
            & (unique_owner[1:] == unique_owner[:-1])
            & (docs[unique_rows[1:]] == docs[unique_rows[:-1]])
        )
        span_bounds = np.searchsorted(owner, shard_ids)
        row_bounds = np.searchsorted(unique_owner, shard_ids)
        if counting:  # one document's rows of one shard are consecutive here: a segment each
            doc_of = docs[unique_rows]
            new_seg = np.ones(len(unique_rows), dtype=bool)
            new_seg[1:] = (unique_owner[1:] != unique_owner[:-1]) | (doc_of[1:] != doc_of[:-1])
            seg_starts = np.flatnonzero(new_seg)
            seg_bounds = np.searchsorted(unique_owner[seg_starts], shard_ids)
        block = max(1, _BLOCK_ELEMENTS // len(row))
        for j0 in range(0, n_j, block):
            counts = prefix[j0 : j0 + block]
            inside = np.take(counts, last + 1, axis=1) - np.take(counts, first, axis=1)
            area[:, j0 : j0 + block] = _group_sums(inside, span_bounds).T
            per_row = (
                inside
                if len(row_starts) == len(row)
                else np.add.reduceat(inside, row_starts, axis=1)
            )
            active = per_row > 0
            rows[:, j0 : j0 + block] = _group_sums(active, row_bounds).T
            start = active.copy()
            start[:, 1:] &= ~(active[:, :-1] & link[1:])
            runs[:, j0 : j0 + block] = _group_sums(start, row_bounds).T
            if doc_count is not None and longest is not None:
                per_seg = _segment_sums(active, seg_starts)
                doc_count[:, j0 : j0 + block] = _group_sums(per_seg > 0, seg_bounds).T
                longest[:, j0 : j0 + block] = _group_max(per_seg, seg_bounds).T
        return areas_chunks.HeadWork(area, rows, runs, doc_count, longest)


def _group_sums(values: np.ndarray, bounds: IntArray) -> np.ndarray:
    """(B, G) sums of ``values[:, bounds[g]:bounds[g + 1]]`` for every group g (empty: 0).

    The groups are shards (a hundred at most, over up to a million spans): one contiguous
    slice sum per group runs several times faster than ``np.add.reduceat`` along the second
    axis, and integer sums are exact in any order.
    """
    sums = np.zeros((values.shape[0], len(bounds) - 1), dtype=np.int64)
    for g, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        if b > a:
            sums[:, g] = values[:, a:b].sum(axis=1, dtype=np.int64)
    return sums


def _segment_sums(values: np.ndarray, starts: IntArray) -> np.ndarray:
    """``np.add.reduceat(values, starts, axis=1, dtype=np.int64)`` (``starts`` increasing).

    A few segments (a document per shard) as slice sums, many times faster than reduceat's
    cast of a boolean array; many segments (many documents) through reduceat, which is then the
    faster. Integer sums: the same either way.
    """
    if len(starts) > 512:
        return np.add.reduceat(values, starts, axis=1, dtype=np.int64)
    ends = [*starts[1:].tolist(), values.shape[1]]
    sums = np.empty((values.shape[0], len(starts)), dtype=np.int64)
    for g, (a, b) in enumerate(zip(starts.tolist(), ends, strict=True)):
        sums[:, g] = values[:, a:b].sum(axis=1, dtype=np.int64)
    return sums


def _group_max(values: np.ndarray, bounds: IntArray) -> np.ndarray:
    """(B, G) maxima of ``values[:, bounds[g]:bounds[g + 1]]`` for every group g (empty: 0)."""
    maxima = np.zeros((values.shape[0], len(bounds) - 1), dtype=np.int64)
    for g, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        if b > a:
            maxima[:, g] = values[:, a:b].max(axis=1)
    return maxima


def _prefix_counts(layouts: Sequence[IntArray], length: int) -> np.ndarray:
    """(shards, length + 1): row j, position x = tokens of ``layouts[j]`` below x.

    The narrowest integer that holds the largest shard (uint16 up to 65,535 tokens a shard, the
    usual case): the table is shards × tokens, so its width is the planner's memory and most of
    its time. Counts within a row only grow, so differences of two entries never go negative;
    a mask's slices never overlap, so a row's spans are disjoint and their sum stays within the
    shard's size. Rows are summed one at a time, which numpy does
    far faster than a cumulative sum along the second axis.
    """
    largest = max((int((layout >= 0).sum()) for layout in layouts), default=0)
    dtype = next(t for t in (np.uint16, np.int32, np.int64) if largest <= np.iinfo(t).max)
    prefix = np.zeros((len(layouts), length + 1), dtype=dtype)
    for j, layout in enumerate(layouts):
        prefix[j, layout[layout >= 0] + 1] = 1
        np.cumsum(prefix[j], out=prefix[j])
    return prefix
