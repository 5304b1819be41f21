"""Block tables: which (query block, key block) tiles a mask touches, and which are full.

Block-sparse kernels skip empty tiles and mask only partial ones. The classification comes from
slice geometry in O(tiles touched): per slice and query block the fully covered key blocks form
one run (monotone edges), and only the run's two end tiles need their area, in closed form. A
tile is full when its slices' areas add up to it (slices are disjoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, band_area, expand, kind_bands

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def uniform_bounds(length: int, block: int) -> IntArray:
    """Block offsets ``[0, B, 2B, ..., length]`` (the last block may be shorter)."""
    if block < 1:
        raise ValueError(f"block size {block} must be >= 1")
    n = -(-length // block)
    return np.minimum(np.arange(n + 1, dtype=np.int64) * block, length)


@dataclass(frozen=True)
class BlockTable:
    """Touched tiles per (mask head, query block), sorted by key block (CSR layout).

    Row ``r = head * num_q_blocks + qb`` owns entries ``ptr[r]:ptr[r+1]`` of ``kv_block``,
    ``full`` and ``coverage`` (attended pairs inside the tile).
    """

    q_bounds: IntArray
    k_bounds: IntArray
    num_heads: int
    ptr: IntArray
    kv_block: IntArray
    full: np.ndarray
    coverage: IntArray
    # Partial contributions (mask slice row, entry index) used to rebuild partial tiles exactly.
    partial_slice: IntArray
    partial_entry: IntArray

    @property
    def num_q_blocks(self) -> int:
        """Number of query blocks."""
        return len(self.q_bounds) - 1

    @property
    def num_k_blocks(self) -> int:
        """Number of key blocks."""
        return len(self.k_bounds) - 1

    def counts(self) -> tuple[IntArray, IntArray]:
        """(partial, full) tile counts per row, each shaped (num_heads, num_q_blocks)."""
        row = np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))
        n_rows = len(self.ptr) - 1
        full = np.bincount(row, weights=self.full, minlength=n_rows).astype(np.int64)
        total = np.diff(self.ptr)
        shape = (self.num_heads, self.num_q_blocks)
        return (total - full).reshape(shape), full.reshape(shape)

    def tile_areas(self) -> IntArray:
        """Number of (q, k) positions of each entry's tile."""
        row = np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))
        qb = row % self.num_q_blocks
        return np.diff(self.q_bounds)[qb] * np.diff(self.k_bounds)[self.kv_block]

    def dense_blocks(self) -> torch.Tensor:
        """(num_heads, num_q_blocks, num_k_blocks) int8: 0 empty, 1 partial, 2 full."""
        out = np.zeros((self.num_heads * self.num_q_blocks, self.num_k_blocks), dtype=np.int8)
        row = np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))
        out[row, self.kv_block] = np.where(self.full, 2, 1)
        return torch.from_numpy(out.reshape(self.num_heads, self.num_q_blocks, self.num_k_blocks))

    def coverage_grid(self) -> np.ndarray:
        """(num_heads, num_q_blocks, num_k_blocks) attended fraction of each tile (for pictures)."""
        grid = np.zeros((self.num_heads * self.num_q_blocks, self.num_k_blocks))
        row = np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))
        grid[row, self.kv_block] = self.coverage / self.tile_areas()
        return grid.reshape(self.num_heads, self.num_q_blocks, self.num_k_blocks)

    def partial_tile_masks(self, mask: AttnMask) -> tuple[IntArray, torch.Tensor]:
        """Dense masks of the partial tiles: (entry indices, bool (n, Bq_max, Bk_max)).

        Rows and columns beyond a shorter edge tile are False. Built from the slices touching
        each tile, never from a dense mask of the whole sequence.
        """
        partial = np.flatnonzero(~self.full)
        slot = np.full(len(self.full), -1, dtype=np.int64)
        slot[partial] = np.arange(len(partial))
        bq = int(np.diff(self.q_bounds).max(initial=0))
        bk = int(np.diff(self.k_bounds).max(initial=0))
        diff = np.zeros((len(partial) * bq, bk + 1), dtype=np.int32)
        use = slot[self.partial_entry] >= 0  # contributions to tiles that ended up full: skip
        if use.any():
            s = mask.slices[self.partial_slice[use]]
            entry = self.partial_entry[use]
            row = np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))[entry]
            q0 = self.q_bounds[row % self.num_q_blocks]
            k0 = self.k_bounds[self.kv_block[entry]]
            k1 = self.k_bounds[self.kv_block[entry] + 1]
            lo, hi = kind_bands(*s.T)
            r_start = np.maximum(s[:, 0], q0)
            r_stop = np.minimum(s[:, 1], self.q_bounds[row % self.num_q_blocks + 1])
            owner, pos = expand(np.maximum(r_stop - r_start, 0))
            rows = r_start[owner] + pos
            first = np.maximum.reduce([s[owner, 2], rows + lo[owner], k0[owner]])
            last = np.minimum.reduce([s[owner, 3] - 1, rows + hi[owner], k1[owner] - 1])
            keep = first <= last
            owner, rows, first, last = owner[keep], rows[keep], first[keep], last[keep]
            flat_row = slot[entry[owner]] * bq + (rows - q0[owner])
            np.add.at(diff, (flat_row, first - k0[owner]), 1)
            np.add.at(diff, (flat_row, last - k0[owner] + 1), -1)
        dense = (np.cumsum(diff[:, :-1], axis=1) > 0).reshape(len(partial), bq, bk)
        return partial, torch.from_numpy(dense)


def _bounds(length: int, spec: IntArray | int) -> IntArray:
    """Offsets from a uniform block size (any integer type) or an explicit offset array."""
    if np.ndim(spec) == 0:
        return uniform_bounds(length, int(spec))
    return np.asarray(spec, dtype=np.int64)


@dataclass(frozen=True)
class TileRuns:
    """Touched tiles as runs of consecutive key blocks, sorted by (row, first key block).

    Full tiles come in long runs (one per slice and query block); every partial tile is a run
    of one. Runs never overlap, so expanding them in order gives the CSR entries of
    `BlockTable`, and other tile layouts (Flex's) can be written from the runs directly.
    """

    row: IntArray
    """``head * num_q_blocks + query block`` of each run."""
    kv_block: IntArray
    """First key block of each run."""
    length: IntArray
    full: np.ndarray
    partial_run: IntArray
    """Run index of each distinct partial tile (in key order)."""
    partial_coverage: IntArray
    partial_slice: IntArray
    """Slice of each partial contribution; ``partial_inverse`` maps it to its distinct tile."""
    partial_inverse: IntArray


def grid_bounds(
    mask: AttnMask, q_bounds: IntArray | int, k_bounds: IntArray | int | None = None
) -> tuple[IntArray, IntArray]:
    """Checked (query, key) block offsets of a grid given by offsets or a uniform size."""
    if k_bounds is None:
        k_bounds = q_bounds
    qb_arr = _bounds(mask.seqlen_q, q_bounds)
    kb_arr = _bounds(mask.seqlen_k, k_bounds)
    for name, b, n in (("q", qb_arr, mask.seqlen_q), ("k", kb_arr, mask.seqlen_k)):
        if b[0] != 0 or b[-1] != n or (np.diff(b) <= 0).any():
            raise ValueError(f"{name} block offsets must rise strictly from 0 to {n}")
    return qb_arr, kb_arr


def block_table(
    mask: AttnMask, q_bounds: IntArray | int, k_bounds: IntArray | int | None = None
) -> BlockTable:
    """Classify every tile of ``mask`` on the given block grid (offsets, or a uniform size)."""
    qb_arr, kb_arr = grid_bounds(mask, q_bounds, k_bounds)
    return _assemble(tile_runs(mask, qb_arr, kb_arr), qb_arr, kb_arr, mask.num_heads)


def tile_runs(mask: AttnMask, qb_arr: IntArray, kb_arr: IntArray) -> TileRuns:
    """The touched tiles of ``mask`` on a checked grid (`grid_bounds`), as sorted runs."""
    n_q, n_k = len(qb_arr) - 1, len(kb_arr) - 1
    s = mask.slices
    head = np.repeat(np.arange(mask.num_heads), np.diff(mask.head_ptr))
    lo, hi = kind_bands(*s.T)

    # (slice, query block) pairs.
    qb0 = np.searchsorted(qb_arr, s[:, 0], side="right") - 1
    qb1 = np.searchsorted(qb_arr, s[:, 1] - 1, side="right") - 1
    sid, pos = expand(qb1 - qb0 + 1)
    qb = qb0[sid] + pos
    r0, r1 = qb_arr[qb], qb_arr[qb + 1]
    # Non-empty rows of the slice inside this query block.
    a = np.maximum.reduce([r0, s[sid, 0], s[sid, 2] - hi[sid]])
    c = np.minimum.reduce([r1, s[sid, 1], s[sid, 3] - lo[sid]])
    live = c > a
    sid, qb, r0, r1, a, c = sid[live], qb[live], r0[live], r1[live], a[live], c[live]
    s_lo, s_hi = lo[sid], hi[sid]
    ks, ke = s[sid, 2], s[sid, 3]
    first_col = np.maximum(ks, a + s_lo)
    last_col = np.minimum(ke - 1, c - 1 + s_hi)
    kb0 = np.searchsorted(kb_arr, first_col, side="right") - 1
    kb1 = np.searchsorted(kb_arr, last_col, side="right") - 1
    # Tiles covered completely: all block rows inside the slice, and the key block inside
    # [L(last row), R(first row)] (the edges only move right as rows go down).
    rows_whole = (a == r0) & (c == r1)
    inner_lo = np.maximum(ks, r1 - 1 + s_lo)
    inner_hi = np.minimum(ke - 1, r0 + s_hi)
    fb0 = np.searchsorted(kb_arr, inner_lo, side="left")
    fb1 = np.searchsorted(kb_arr, inner_hi + 1, side="right") - 2
    fb0 = np.maximum(fb0, kb0)
    fb1 = np.minimum(fb1, kb1)
    has_full = rows_whole & (fb1 >= fb0)
    fb0 = np.where(has_full, fb0, kb1 + 1)
    fb1 = np.where(has_full, fb1, kb1)

    # Partial contributions: [kb0, fb0) and (fb1, kb1].
    left_n = np.where(has_full, fb0 - kb0, kb1 - kb0 + 1)
    right_n = np.where(has_full, kb1 - fb1, 0)
    l_owner, l_pos = expand(left_n)
    r_owner, r_pos = expand(right_n)
    p_owner = np.concatenate([l_owner, r_owner])
    p_kb = np.concatenate([kb0[l_owner] + l_pos, fb1[r_owner] + 1 + r_pos])
    p_area = band_area(
        a[p_owner],
        c[p_owner],
        np.maximum(ks[p_owner], kb_arr[p_kb]),
        np.minimum(ke[p_owner], kb_arr[p_kb + 1]),
        s_lo[p_owner],
        s_hi[p_owner],
    )
    row_of = head[sid] * n_q + qb
    p_key = row_of[p_owner] * n_k + p_kb
    # Several slices may share a partial tile: merge its contributions (few, one per run end).
    p_uniq, p_inverse = np.unique(p_key, return_inverse=True)
    p_cov = np.bincount(p_inverse.reshape(-1), weights=p_area, minlength=len(p_uniq))
    p_row, p_col = np.divmod(p_uniq, n_k)
    dq, dk = np.diff(qb_arr), np.diff(kb_arr)
    p_full = p_cov.astype(np.int64) == dq[p_row % max(n_q, 1)] * dk[p_col]
    seg_row = np.concatenate([row_of[has_full], p_row])
    seg_kb = np.concatenate([fb0[has_full], p_col])
    seg_len = np.concatenate([(fb1 - fb0 + 1)[has_full], np.ones(len(p_row), dtype=np.int64)])
    seg_full = np.concatenate([np.ones(int(has_full.sum()), dtype=bool), p_full])
    # A full tile is covered by one slice alone (slices are disjoint) and no other slice touches
    # it, so runs never overlap: sorting the few thousand runs orders the millions of tiles.
    order = np.argsort(seg_row * n_k + seg_kb, kind="stable")
    partial_run = np.empty(len(p_row), dtype=np.int64)
    is_partial = order >= len(order) - len(p_row)
    partial_run[order[is_partial] - (len(order) - len(p_row))] = np.flatnonzero(is_partial)
    return TileRuns(
        row=seg_row[order],
        kv_block=seg_kb[order],
        length=seg_len[order],
        full=seg_full[order],
        partial_run=partial_run,
        partial_coverage=p_cov.astype(np.int64),
        partial_slice=sid[p_owner],
        partial_inverse=p_inverse.reshape(-1),
    )


def _assemble(runs: TileRuns, qb_arr: IntArray, kb_arr: IntArray, num_heads: int) -> BlockTable:
    """Expand sorted runs into the CSR table, each per-tile array written in one or two passes.

    At 1M tokens a causal table holds 33.5M tiles: no per-tile temporaries are made (key blocks
    are a running sum, coverages one ``repeat`` of a per-run value).
    """
    n_q = len(qb_arr) - 1
    dq, dk = np.diff(qb_arr), np.diff(kb_arr)
    seg_len = runs.length
    seg_off = np.cumsum(seg_len) - seg_len
    total = int(seg_len.sum())
    kv_block = np.ones(total, dtype=np.int64)
    if total:
        # Along a run the key block grows by one; at a run start it jumps from the previous
        # run's last block (from 0, where the running sum starts) to the run's first block.
        prev_last = np.concatenate([[0], runs.kv_block[:-1] + seg_len[:-1] - 1])
        kv_block[seg_off] = runs.kv_block - prev_last
        np.cumsum(kv_block, out=kv_block)
    full = np.repeat(runs.full, seg_len)
    # Full tiles cover their whole tile; partial tiles carry their summed areas.
    row_height = dq[runs.row % max(n_q, 1)]
    if len(dk) == 0 or (dk != dk[0]).any():
        coverage = np.repeat(row_height, seg_len)
        coverage *= dk[kv_block]
    else:  # uniform key blocks: one width for every tile
        coverage = np.repeat(row_height * dk[0], seg_len)
    slot_of_partial = seg_off[runs.partial_run]
    coverage[slot_of_partial] = runs.partial_coverage
    per_row = np.bincount(runs.row, weights=seg_len, minlength=num_heads * n_q).astype(np.int64)
    ptr = np.concatenate([[0], np.cumsum(per_row)])
    return BlockTable(
        q_bounds=qb_arr,
        k_bounds=kb_arr,
        num_heads=num_heads,
        ptr=ptr.astype(np.int64),
        kv_block=kv_block,
        full=full,
        coverage=coverage.astype(np.int64, copy=False),
        partial_slice=runs.partial_slice,
        partial_entry=slot_of_partial[runs.partial_inverse].astype(np.int64),
    )
