"""`lcab.plan.areas`'s pair table from chunks of the layouts: O(segments × shards), not per row.

Layouts are unions of a few contiguous runs of positions (zigzag: two a rank), so the key
positions fall into *chunks*: maximal runs held by one key shard. Within a
slice a row's attended span is ``[first, last]``, both affine in the row, so the rows of a head
cut into *segments* — consecutive rows of one slice, row shard and document whose ``first`` and
``last`` stay in the same chunks and keep their slope. Every row of a segment touches the same
chunks ``cf..cl`` and so is active for the same key shards; its area is whole chunks in between
plus two partial end chunks, summed in closed form over the segment's rows. The cuts come from
the slices' geometry (chunk starts crossed by ``first`` and ``last``), never from a per-row
array, so a head costs O(slices + chunks + segments × shards).

A head whose rows have several spans (several slices on one row: shared questions, prefixes)
is not handled here: `head_work` returns None and the caller counts it per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix

from lcab.masks.geometry import INF, IntArray, kind_bands

#: `head_work` gives up when segments plus chunks exceed the head's rows times this: the per-row
#: count (`lcab.plan.areas`) is then about as fast, and its tables are smaller.
MAX_SEGMENTS_PER_ROW = 1.0

#: Largest (segments or chunks) × shards table `head_work` builds (its float64 token table is
#: 8 bytes an element): beyond it the per-row count, which works in bounded blocks, is used.
MAX_TABLE = 1 << 25


@dataclass(frozen=True)
class Shards:
    """Shards over one sequence as chunks: maximal runs of positions held by one shard.

    Built once per list of shards and shared by the heads of a mask and by both passes of
    `lcab.plan.areas.pair_work` (rows and keys swap in the transposed pass).
    """

    owner: np.ndarray
    """(length,) int32 shard of every position, -1 for none (a token in two: the last)."""
    starts: IntArray
    """(C + 1,) chunk c covers positions ``starts[c]:starts[c + 1]``; ``starts[C]`` = length."""
    chunk_owner: np.ndarray
    """(C,) int32 shard of chunk c."""
    count: int
    """Shards."""
    disjoint: bool
    """Every token in one shard at most: only then can a chunk stand for its keys."""

    @classmethod
    def of(cls, sets: Sequence[IntArray], length: int) -> Shards:
        """The chunks of ``sets`` (arrays of token ids, -1 for padding) over ``length``."""
        owner = np.full(length, -1, dtype=np.int32)  # half the traffic of int64
        given = 0
        for index, layout in enumerate(sets):
            tokens = layout[layout >= 0]
            owner[tokens] = index
            given += len(tokens)
        cuts = np.flatnonzero(owner[1:] != owner[:-1]) + 1
        starts = np.concatenate([[0], cuts, [length]]).astype(np.int64)
        # a token given twice (to two shards, or twice to one) leaves fewer held than given
        disjoint = int(np.count_nonzero(owner >= 0)) == given
        return cls(owner, starts, owner[starts[:-1]], len(sets), disjoint)

    def chunk_of(self, position: IntArray) -> IntArray:
        """Chunk of each position."""
        return np.searchsorted(self.starts, position, side="right") - 1

    @cached_property
    def tokens(self) -> np.ndarray:
        """(C + 1, shards): tokens of shard j in the chunks before c (narrowest unsigned type).

        The cumulative sum runs over blocks of rows: along the first axis of the whole table
        numpy is several times slower.
        """
        sizes = np.diff(self.starts)
        held = np.flatnonzero(self.chunk_owner >= 0)
        largest = np.bincount(self.chunk_owner[held], sizes[held], self.count).max(initial=0)
        dtype = next(t for t in (np.uint16, np.uint32, np.uint64) if largest <= np.iinfo(t).max)
        table = np.zeros((len(sizes) + 1, self.count), dtype=dtype)
        table[held + 1, self.chunk_owner[held]] = sizes[held]
        for at in range(0, len(table), _BLOCK_ROWS):
            block = table[at : at + _BLOCK_ROWS]
            np.cumsum(block, axis=0, dtype=dtype, out=block)
            if at:
                block += table[at - 1]
        return table

    @cached_property
    def tokens_float(self) -> np.ndarray:
        """`tokens` as float64, for sparse products (exact: every count is below 2**53)."""
        return self.tokens.astype(np.float64)


#: Rows of `Shards.tokens` summed at a time (a block of 96 shards stays in the cache).
_BLOCK_ROWS = 256


@dataclass(frozen=True)
class HeadWork:
    """One head's (I, J) tables, as `lcab.plan.areas.PairWork` holds them per head."""

    area: np.ndarray
    rows: np.ndarray
    runs: np.ndarray
    col_docs: np.ndarray | None
    longest_cols: np.ndarray | None


@dataclass(frozen=True)
class Segments:
    """Rows ``start:stop`` of one slice, row shard and document, touching chunks ``cf..cl``."""

    start: IntArray
    stop: IntArray
    shard: IntArray
    doc: IntArray
    sum_first: IntArray
    """Sum over the segment's rows of the first attended key."""
    sum_last: IntArray
    cf: IntArray
    cl: IntArray


def _expand(begin: IntArray, end: IntArray) -> tuple[IntArray, IntArray]:
    """(owner, index) of every index ``begin[s] <= index < end[s]``, s by s."""
    counts = np.maximum(end - begin, 0)
    owner = np.repeat(np.arange(len(counts)), counts)
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    return owner, np.repeat(begin, counts) + offsets


def segments(slices: IntArray, rows: Shards, keys: Shards, doc_starts: IntArray) -> Segments | None:
    """The segments of one head's slices, sorted by (row shard, row); None: multi-span rows.

    A slice's row r attends ``first = max(k0, r + lo)`` to ``last = min(k1 - 1, r + hi)``
    (`lcab.masks.geometry.row_spans`). The kinds' bands run through the rectangle's corners
    (`kind_bands`), so in a slice ``first`` is ``k0`` on every row (no lower band edge) or
    ``r + lo`` on every row, and ``last`` is ``k1 - 1`` or ``r + hi``: a sloped one enters the
    next chunk where it meets a chunk start. Those rows, the slices' row ranges, the row
    shards' chunk starts and the document starts cut the rows into segments.
    """
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    lo, hi = kind_bands(s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4])
    k0, k1 = s[:, 2], s[:, 3]
    a = np.maximum(s[:, 0], k0 - hi)  # the rows with first <= last
    b = np.minimum(s[:, 1], k1 - lo)
    keep = (b > a) & (k1 > k0) & (hi >= lo)
    order = np.argsort(a[keep], kind="stable")
    a, b, k0, k1, lo, hi = (x[keep][order] for x in (a, b, k0, k1, lo, hi))
    if np.any(a[1:] < b[:-1]):
        return None
    chunk_starts = keys.starts[1:-1]
    crossings = [a, b, rows.starts, doc_starts]
    for edge, sloped in ((lo, lo > -INF), (hi, hi < INF)):
        # rows a < r < b of the sloped slices where r + edge is a chunk start
        begin = np.searchsorted(chunk_starts, a + edge, side="right")
        end = np.where(sloped, np.searchsorted(chunk_starts, b + edge, side="left"), 0)
        owner, index = _expand(begin, end)
        crossings.append(chunk_starts[index] - edge[owner])
    # every part is sorted (crossings: slice by slice), which a stable sort merges quickly
    cuts = np.sort(np.concatenate(crossings), kind="stable")
    cuts = cuts[np.r_[True, cuts[1:] != cuts[:-1]]]
    start, stop = cuts[:-1], cuts[1:]
    sl = np.searchsorted(a, start, side="right") - 1
    ok = sl >= 0
    sl = np.maximum(sl, 0)
    ok &= start < b[sl] if len(b) else np.zeros(len(start), dtype=bool)
    start, stop, sl = start[ok], stop[ok], sl[ok]
    shard = rows.owner[start]
    held = shard >= 0
    start, stop, shard, sl = start[held], stop[held], shard[held], sl[held]
    order = np.argsort(shard, kind="stable")
    start, stop, shard, sl = start[order], stop[order], shard[order], sl[order]
    k0, k1, lo, hi = k0[sl], k1[sl], lo[sl], hi[sl]
    n = stop - start
    ramp = n * (n - 1) // 2  # sum of r - start over the segment's rows
    first_sloped, last_sloped = lo > -INF, hi < INF
    first = np.where(first_sloped, start + lo, k0)
    last = np.where(last_sloped, start + hi, k1 - 1)
    return Segments(
        start=start,
        stop=stop,
        shard=shard,
        doc=np.searchsorted(doc_starts, start, side="right"),
        sum_first=n * first + np.where(first_sloped, ramp, 0),
        sum_last=n * last + np.where(last_sloped, ramp, 0),
        cf=keys.chunk_of(first),
        cl=keys.chunk_of(np.where(last_sloped, last + n - 1, last)),
    )


def head_work(
    slices: IntArray,
    rows: Shards,
    keys: Shards,
    doc_starts: IntArray,
    per_doc: bool,
    with_area: bool = True,
    max_segments_per_row: float = MAX_SEGMENTS_PER_ROW,
) -> HeadWork | None:
    """One head's tables from its segments, for row shards ``rows`` and key shards ``keys``.

    None where the chunks cannot count it: rows with several spans, a key in two shards, more
    segments and chunks than ``max_segments_per_row`` times the rows (counting rows is then as
    fast), tables beyond `MAX_TABLE`, or areas beyond float64's exact integers.
    ``doc_starts`` are the starts of documents 1..; ``per_doc`` also counts, per pair, the
    documents with active rows and the active rows of the document with the most
    (`lcab.plan.areas.PairWork.col_docs`, ``longest_cols``); ``with_area=False`` leaves
    ``area`` and ``runs`` zero.
    """
    exceeds = (len(keys.chunk_owner) + 1) * keys.count > MAX_TABLE
    if exceeds or not keys.disjoint or len(keys.owner) * (len(rows.owner) + 1) >= 1 << 53:
        return None
    seg = segments(slices, rows, keys, doc_starts)
    if seg is None:
        return None
    n = seg.stop - seg.start
    n_rows = int(n.sum())
    many = len(n) + len(keys.chunk_owner) > max_segments_per_row * n_rows
    if many or len(n) * keys.count > MAX_TABLE:
        return None
    n_i, n_j = rows.count, keys.count
    shape = (n_i, n_j)
    area, counted, runs = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    doc_count, longest = (np.zeros(shape), np.zeros(shape)) if per_doc else (None, None)
    if n_rows == 0:
        return HeadWork(area, counted, runs, doc_count, longest)
    # counts of rows stay below 2**24: float32 sums of them are exact, in any order
    exact = np.float32 if n_rows < 1 << 24 else np.float64
    active = _active(seg, keys, exact)
    shard_ptr = np.searchsorted(seg.shard, np.arange(n_i + 1))
    if with_area:
        area += _area(seg, keys, shard_ptr, n_i)
        runs += _runs(seg, active, shard_ptr)
    if doc_count is None or longest is None:
        counted += _sums(shard_ptr, n.astype(exact), active)
        return HeadWork(area, counted, runs, doc_count, longest)
    new_group = np.ones(len(n), dtype=bool)
    new_group[1:] = (seg.shard[1:] != seg.shard[:-1]) | (seg.doc[1:] != seg.doc[:-1])
    group_ptr = np.append(np.flatnonzero(new_group), len(n))
    per_group = _sums(group_ptr, n.astype(exact), active)
    in_shard = np.searchsorted(group_ptr, shard_ptr)
    ones = np.ones(len(per_group), exact)
    counted += _sums(in_shard, ones, per_group)
    doc_count += _sums(in_shard, ones, (per_group > 0).astype(exact))
    for i in np.flatnonzero(np.diff(in_shard)).tolist():
        longest[i] = per_group[in_shard[i] : in_shard[i + 1]].max(axis=0)
    return HeadWork(area, counted, runs, doc_count, longest)


def _active(seg: Segments, keys: Shards, dtype: type) -> np.ndarray:
    """(S, J) 1 where segment s has keys of shard j, else 0.

    The owners of its end chunks, and the shards with tokens in the chunks between.
    """
    active: np.ndarray = np.empty((len(seg.start), keys.count), dtype=dtype)
    mid = np.minimum(seg.cf + 1, seg.cl)
    np.greater(keys.tokens[seg.cl], keys.tokens[mid], out=active, casting="unsafe")
    index = np.arange(len(seg.start))
    for chunk in (seg.cf, seg.cl):
        owner = keys.chunk_owner[chunk]
        active[index[owner >= 0], owner[owner >= 0]] = 1
    return active


def _area(seg: Segments, keys: Shards, shard_ptr: IntArray, n_i: int) -> np.ndarray:
    """(I, J) attended keys: the end chunks' parts of every segment, and its whole chunks.

    A segment's end chunk ``cf`` holds ``starts[cf + 1] - first`` of a row's keys, ``cl``
    holds ``last - starts[cl] + 1`` (one chunk: ``last - first + 1``), summed over its rows
    from the sums of ``first`` and ``last``; the chunks between add ``n × tokens`` per shard.
    """
    n_j = keys.count
    n = seg.stop - seg.start
    own_f, own_l = keys.chunk_owner[seg.cf], keys.chunk_owner[seg.cl]
    single = seg.cf == seg.cl
    part_f = np.where(
        single, seg.sum_last - seg.sum_first + n, n * keys.starts[seg.cf + 1] - seg.sum_first
    )
    part_l = np.where(single, 0, seg.sum_last - n * (keys.starts[seg.cl] - 1))
    cell = np.concatenate([seg.shard * n_j + own_f, seg.shard * n_j + own_l])
    part = np.concatenate([part_f, part_l])
    ends = np.concatenate([own_f, own_l]) >= 0
    area = np.bincount(cell[ends], weights=part[ends], minlength=n_i * n_j).reshape(n_i, n_j)
    # n * (tokens[cl] - tokens[cf + 1]) summed per shard: one product with the token table
    interior = np.stack([seg.cl, np.minimum(seg.cf + 1, seg.cl)], axis=1).ravel()
    weights = np.stack([n, -n], axis=1).ravel().astype(np.float64)
    return area + _sums(2 * shard_ptr, weights, keys.tokens_float, interior)


def _runs(seg: Segments, active: np.ndarray, shard_ptr: IntArray) -> np.ndarray:
    """(I, J) runs of consecutive active rows.

    A segment starts one for each key shard it is active for, unless it continues the previous
    segment (the next rows of the same shard and document) and that one was active too.
    """
    link = (
        (seg.shard[1:] == seg.shard[:-1])
        & (seg.start[1:] == seg.stop[:-1])
        & (seg.doc[1:] == seg.doc[:-1])
    )
    linked = np.flatnonzero(link) + 1
    both = np.minimum(active[linked], active[linked - 1])
    ones = np.ones(len(active), active.dtype)
    runs = _sums(shard_ptr, ones, active)
    return runs - _sums(np.searchsorted(linked, shard_ptr), ones[: len(linked)], both)


def _sums(
    ptr: IntArray, weights: np.ndarray, values: np.ndarray, columns: IntArray | None = None
) -> np.ndarray:
    """(G, J): ``weights @ values[columns]`` over each group ``ptr[g]:ptr[g + 1]`` of entries.

    A sparse (groups × rows) product: one pass over the rows whatever the number of groups,
    where ``np.add.reduceat`` along the first axis is several times slower. Every weight and
    value is an integer and the dtype holds the sums exactly, so the order does not matter.
    ``columns`` (default: entry e is row e) picks the row of ``values`` of each entry.
    """
    if columns is None:
        columns = np.arange(len(weights))
    shape = (len(ptr) - 1, len(values))
    return np.asarray(csr_matrix((weights, columns, ptr), shape=shape) @ values)
