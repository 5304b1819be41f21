"""FlexAttention lowering: a `BlockMask` built from slice geometry plus a compact `mask_mod`.

`torch.nn.attention.flex_attention.create_block_mask` evaluates a predicate at every one of the
Sq·Sk positions to find empty, partial and full tiles. lcab already knows them from the slices
(`block_table`, O(tiles touched)), so the BlockMask is assembled directly with
`BlockMask.from_kv_blocks`. The `mask_mod`, which Flex evaluates only inside partial tiles, is
one of two compact exact predicates:

* ``intervals`` — per query row, its K merged key intervals (K = most intervals of any row; 1
  or 2 for every static pattern): memory O(Sq·K);
* ``grid`` — for masks made only of full rectangles on a common g-aligned grid (block-sparse
  patterns): a boolean table of (Sq/g) x (Sk/g) cells.

The smaller of the two applicable forms is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

import numpy as np
import torch

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, SliceKind
from lcab.masks.lowering.blocks import BlockTable, block_table

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: Flex's default tile size.
FLEX_BLOCK = 128


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

    def nbytes(self) -> int:
        """Memory held by the predicate's tensors."""
        return sum(
            t.numel() * t.element_size()
            for t in (self.starts, self.ends, self.grid)
            if t is not None
        )

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
    ri = mask.row_intervals()
    width = max(ri.max_per_row(), 1)
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
    counts = np.diff(ri.ptr)
    rows = np.repeat(np.arange(len(counts)), counts)
    slot = np.arange(len(rows)) - np.repeat(ri.ptr[:-1], counts)
    starts = np.zeros((len(counts), width), dtype=np.int32)
    ends = np.zeros((len(counts), width), dtype=np.int32)
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
    rows: IntArray, cols: IntArray, n_rows: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR entries (already sorted by row, col) → (num (n_rows,), indices (n_rows, width))."""
    num = np.bincount(rows, minlength=n_rows).astype(np.int32)
    idx = np.zeros((n_rows, max(width, 1)), dtype=np.int32)
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(num) - num, num)
    idx[rows, slot] = cols
    return torch.from_numpy(num), torch.from_numpy(idx)


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
    """
    from torch.nn.attention.flex_attention import BlockMask

    group = max(_head_group(mask, heads_q), 1)
    table = table if table is not None else block_table(mask, block_size)
    n_q, n_k = table.num_q_blocks, table.num_k_blocks
    rows = np.repeat(np.arange(len(table.ptr) - 1), np.diff(table.ptr))
    cols, full, heads = table.kv_block, table.full, mask.num_heads
    if group > 1:  # query head h reads mask head h // group: repeat rows, keep them sorted
        mask_head, qb = np.divmod(rows, n_q)
        g = np.tile(np.arange(group), len(rows))
        rows = (np.repeat(mask_head, group) * group + g) * n_q + np.repeat(qb, group)
        cols, full = np.repeat(cols, group), np.repeat(full, group)
        order = np.lexsort((cols, rows))
        rows, cols, full = rows[order], cols[order], full[order]
        heads = mask.num_heads * group
    n_rows = heads * n_q
    # Flex reads the number of key blocks from the last dimension of the index tensors.
    kv_num, kv_idx = _ordered(rows[~full], cols[~full], n_rows, n_k)
    full_num, full_idx = _ordered(rows[full], cols[full], n_rows, n_k)
    # The query-major view (for the backward pass), transposed from the same sparse entries
    # rather than by BlockMask.from_kv_blocks's dense argsort over every tile.
    head, qb = np.divmod(rows, n_q)
    t_rows = head * n_k + cols
    order = np.lexsort((qb, t_rows))
    t_rows, t_cols, t_full = t_rows[order], qb[order], full[order]
    q_num, q_idx = _ordered(t_rows[~t_full], t_cols[~t_full], heads * n_k, n_q)
    full_q_num, full_q_idx = _ordered(t_rows[t_full], t_cols[t_full], heads * n_k, n_q)
    predicate = flex_mask_mod(mask, heads_q)

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
