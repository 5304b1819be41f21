"""FlexAttention lowering: a `BlockMask` built from slice geometry plus a compact `mask_mod`.

`create_block_mask` evaluates a predicate at all Sq·Sk positions; lcab knows the tiles from the
slices (`tile_runs`), so the BlockMask's index tensors are written from those runs (query-major
ones from the transposed mask's), sorting nothing. The `mask_mod`, evaluated only inside partial
tiles, is one of two compact exact predicates:

* ``intervals`` — per query row, its K merged key intervals (K = most intervals of any row; 1
  or 2 for every static pattern): memory O(Sq·K);
* ``grid`` — for masks made only of full rectangles on a common g-aligned grid (block-sparse
  patterns): a boolean table of (Sq/g) x (Sk/g) cells.

The smaller of the two applicable forms is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import reduce
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, SliceKind
from lcab.masks.lowering.blocks import BlockTable, TileRuns, grid_bounds, tile_runs
from lcab.masks.lowering.rows import row_intervals, single_row_bounds

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

MaskMod: TypeAlias = (
    "Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]"
)

#: Flex's default tile size.
FLEX_BLOCK = 128

#: Index-tensor size (bytes) from which the query-major half is built on a second thread.
PARALLEL_BYTES = 1 << 25

#: Mean run length (tiles) from which index rows are written run by run instead of scattered.
LONG_RUN = 64


def _head_group(mask: AttnMask, heads_q: int | None) -> int:
    """Query heads per mask head; 0 for head-shared masks, which broadcast over heads."""
    if mask.num_heads == 1:
        return 0
    if heads_q is None or heads_q % mask.num_heads:
        raise ValueError(
            f"a mask with {mask.num_heads} heads needs heads_q, a multiple of {mask.num_heads}; "
            f"got heads_q={heads_q}"
        )
    return heads_q // mask.num_heads


@dataclass(frozen=True)
class FlexMaskMod:
    """The exact predicate of a mask as Flex ``mask_mod`` data (see module docstring)."""

    form: str
    group: int
    """Query heads per mask head; 0 for head-shared masks (the head index is ignored)."""
    seqlen_q: int
    seqlen_k: int
    starts: torch.Tensor | None = None
    ends: torch.Tensor | None = None
    grid: torch.Tensor | None = None
    cell: int = 1

    def to(self, device: str | torch.device) -> FlexMaskMod:
        """The same predicate with its tensors on ``device``.

        The mask_mod indexes them with FlexAttention's own index tensors, so both must live
        where the kernel runs (compiled Flex on CUDA fails to lower host tensors).
        """

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(self, starts=move(self.starts), ends=move(self.ends), grid=move(self.grid))

    def as_mask_mod(self) -> MaskMod:
        """A ``mask_mod(b, h, q_idx, kv_idx)`` closure for FlexAttention."""
        group, sq, sk = self.group, self.seqlen_q, self.seqlen_k
        if self.form == "grid":
            grid, cell = self.grid, self.cell
            assert grid is not None

            def grid_mask_mod(
                b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
            ) -> torch.Tensor:
                q = q_idx.clamp(max=sq - 1) // cell
                k = kv_idx.clamp(max=sk - 1) // cell
                return grid[h // group if group else 0, q, k]

            return grid_mask_mod
        starts, ends = self.starts, self.ends
        assert starts is not None and ends is not None
        width = starts.shape[1]

        def interval_mask_mod(
            b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            row = q_idx.clamp(max=sq - 1)
            if group:
                row = row + (h // group) * sq
            hit = (starts[row, 0] <= kv_idx) & (kv_idx < ends[row, 0])
            for k in range(1, width):
                hit = hit | ((starts[row, k] <= kv_idx) & (kv_idx < ends[row, k]))
            return hit

        return interval_mask_mod


def _grid_cell(mask: AttnMask) -> int:
    """Largest g aligning every slice edge and sequence end, or 0 if a slice is not full."""
    s = mask.slices
    if len(s) == 0 or (s[:, 4] != SliceKind.FULL).any():
        return 0
    edges = np.concatenate([s[:, :4].reshape(-1), [mask.seqlen_q, mask.seqlen_k]])
    return int(reduce(math.gcd, np.unique(edges).tolist(), 0))


def flex_mask_mod(mask: AttnMask, heads_q: int | None = None) -> FlexMaskMod:
    """The compact exact predicate of ``mask`` for FlexAttention."""
    group = _head_group(mask, heads_q)
    # Rows meeting one slice each (documents, causal, windows) have one interval per row,
    # written straight into the int32 table without building `RowIntervals` first.
    single = single_row_bounds(mask)
    ri = row_intervals(mask) if single is None else None
    width = 1 if ri is None else max(ri.max_per_row(), 1)
    interval_bytes = 2 * 4 * mask.num_heads * mask.seqlen_q * width
    cell = _grid_cell(mask)
    if cell:
        nq, nk = -(-mask.seqlen_q // cell), -(-mask.seqlen_k // cell)
        if mask.num_heads * nq * nk <= interval_bytes:
            grid = np.zeros((mask.num_heads, nq, nk), dtype=bool)
            for h in range(mask.num_heads):
                for q0, q1, k0, k1, _ in mask.head_slices(h).tolist():
                    grid[h, q0 // cell : -(-q1 // cell), k0 // cell : -(-k1 // cell)] = True
            return FlexMaskMod(
                "grid", group, mask.seqlen_q, mask.seqlen_k, grid=torch.from_numpy(grid), cell=cell
            )
    if ri is None:
        assert single is not None
        starts, ends = single[0].reshape(-1, 1), single[1].reshape(-1, 1)
    else:
        counts = np.diff(ri.ptr)
        starts = np.zeros((len(counts), width), dtype=np.int32)
        ends = np.zeros((len(counts), width), dtype=np.int32)
        rows = np.repeat(np.arange(len(counts)), counts)
        slot = np.arange(len(rows)) - np.repeat(ri.ptr[:-1], counts)
        starts[rows, slot] = ri.starts
        ends[rows, slot] = ri.ends
    return FlexMaskMod(
        "intervals",
        group,
        mask.seqlen_q,
        mask.seqlen_k,
        starts=torch.from_numpy(starts),
        ends=torch.from_numpy(ends),
    )


def _ordered(
    row: IntArray, col: IntArray, length: IntArray, n_rows: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs sorted by (row, col), never overlapping → (num (n_rows,), indices (n_rows, width)).

    Row r lists its columns left-aligned, zero padded; written run by run (``repeat`` plus a
    shared ``arange``), with no per-tile sort or dense pass.
    """
    num = np.bincount(row, weights=length, minlength=n_rows).astype(np.int64)
    idx = np.zeros((n_rows, max(width, 1)), dtype=np.int32)
    if len(row) and len(row) * LONG_RUN <= int(length.sum()):
        # Few long runs (full tiles of large documents): one slice write per run beats building
        # millions of per-tile positions for a scatter.
        # Every run is a slice of one shared arange: a copy per run, no allocation per run.
        flat, base = idx.reshape(-1), np.arange(idx.shape[1], dtype=np.int32)
        dest = row * idx.shape[1] + np.cumsum(length) - length - (np.cumsum(num) - num)[row]
        for d, c, n in zip(dest.tolist(), col.tolist(), length.tolist(), strict=True):
            flat[d : d + n] = base[c : c + n]
    elif len(row):
        # Per-tile arrays dominate (millions of tiles): int32 halves their memory traffic.
        wide = idx.size >= np.iinfo(np.int32).max
        dtype = np.int64 if wide else np.int32
        off = np.cumsum(length) - length
        row_start = np.cumsum(num) - num
        step = np.arange(int(length.sum()), dtype=dtype)
        value = np.repeat((col - off).astype(dtype), length) + step
        shift = (row * idx.shape[1] - row_start[row] - col + off).astype(dtype)
        idx.reshape(-1)[value + np.repeat(shift, length)] = value
    return torch.from_numpy(num.astype(np.int32)), torch.from_numpy(idx)


def _view(
    runs: TileRuns, group: int, n_blocks: int, width: int, heads: int, full: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(num, indices) of the full (or partial) tiles, mask head h repeated for ``group`` heads."""
    keep = runs.full == full
    row, col, length = runs.row[keep], runs.kv_block[keep], runs.length[keep]
    if group > 1:  # query head h reads mask head h // group: repeat rows, keep them sorted
        mask_head, blk = np.divmod(row, n_blocks)
        g = np.tile(np.arange(group), len(row))
        row = (np.repeat(mask_head, group) * group + g) * n_blocks + np.repeat(blk, group)
        col, length = np.repeat(col, group), np.repeat(length, group)
        order = np.lexsort((col, row))
        row, col, length = row[order], col[order], length[order]
    return _ordered(row, col, length, heads * n_blocks, width)


def _table_runs(table: BlockTable) -> TileRuns:
    """A given table's tiles as runs of one (only row, key block and full are read)."""
    none = np.zeros(0, dtype=np.int64)
    return TileRuns(
        row=np.repeat(np.arange(len(table.ptr) - 1), np.diff(table.ptr)),
        kv_block=table.kv_block,
        length=np.ones(len(table.kv_block), dtype=np.int64),
        full=table.full,
        partial_run=none,
        partial_coverage=none,
        partial_slice=none,
        partial_inverse=none,
    )


def flex_block_mask(
    mask: AttnMask,
    *,
    heads_q: int | None = None,
    block_size: int = FLEX_BLOCK,
    device: str | torch.device = "cpu",
    table: BlockTable | None = None,
) -> torch.nn.attention.flex_attention.BlockMask:
    """FlexAttention `BlockMask` of ``mask``: tiles from slice geometry, exact `mask_mod`.

    Head-shared masks give a BlockMask with one head that broadcasts over query heads; per-KV-head
    masks are expanded to ``heads_q`` heads (query head h uses mask head h // (heads_q / H)).
    ``table``, if given, must be ``block_table(mask, block_size)``.
    """
    from torch.nn.attention.flex_attention import BlockMask

    group = max(_head_group(mask, heads_q), 1)
    qb_arr, kb_arr = grid_bounds(mask, block_size)
    n_q, n_k = len(qb_arr) - 1, len(kb_arr) - 1
    heads = mask.num_heads * group

    def query_major() -> tuple[
        tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
    ]:
        # The query-major view (for the backward pass) is the key-major view of the transposed
        # mask: the same tiles, listed per key block, again from runs instead of a sort.
        t_runs = tile_runs(mask.transpose(), kb_arr, qb_arr)
        partial = _view(t_runs, group, n_k, n_q, heads, full=False)
        return partial, _view(t_runs, group, n_k, n_q, heads, full=True)

    # Flex's index tensors are dense (heads * blocks, blocks) int32, and their fresh pages cost
    # more than what is written into them (~23 ms per 8192 x 8192 tensor on the CI machine).
    # Large ones are therefore built half on a second thread: numpy and the kernel's page
    # clearing run without the GIL, so the two halves overlap when a second core is free.
    parallel = heads * n_q * n_k * 4 >= PARALLEL_BYTES
    with ThreadPoolExecutor(1) if parallel else nullcontext() as pool:
        later = pool.submit(query_major) if pool is not None else None
        runs = _table_runs(table) if table is not None else tile_runs(mask, qb_arr, kb_arr)
        # Flex reads the number of key blocks from the last dimension of the index tensors.
        kv_num, kv_idx = _view(runs, group, n_q, n_k, heads, full=False)
        full_num, full_idx = _view(runs, group, n_q, n_k, heads, full=True)
        predicate = flex_mask_mod(mask, heads_q).to(device)
        (q_num, q_idx), (full_q_num, full_q_idx) = (
            later.result() if later is not None else query_major()
        )

    def put(x: torch.Tensor, rows_per_head: int) -> torch.Tensor:
        return x.reshape(1, heads, rows_per_head, *x.shape[1:]).to(device)

    return BlockMask(
        seq_lengths=(mask.seqlen_q, mask.seqlen_k),
        kv_num_blocks=put(kv_num, n_q),
        kv_indices=put(kv_idx, n_q),
        full_kv_num_blocks=put(full_num, n_q),
        full_kv_indices=put(full_idx, n_q),
        q_num_blocks=put(q_num, n_k),
        q_indices=put(q_idx, n_k),
        full_q_num_blocks=put(full_q_num, n_k),
        full_q_indices=put(full_q_idx, n_k),
        BLOCK_SIZE=(block_size, block_size),
        mask_mod=predicate.as_mask_mod(),
    )
