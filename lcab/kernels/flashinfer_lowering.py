"""FlashInfer's block-sparse mask forms, derived from a mask's block table (pure, no package).

BSR (one pattern for all heads) in the cheapest exact form: whole tiles, the ``causal`` flag, or
a per-tile element mask; variable blocks (one pattern per KV head): each head's slice edges,
refined to common block counts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, slice_areas
from lcab.masks.lowering.blocks import BlockTable, block_table

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

BsrMode = Literal["plain", "causal", "element"]
"""How a BSR call is exact: whole tiles only, FlashInfer's causal flag, or element masks."""


@dataclass(frozen=True)
class BsrArgs:
    """What ``BlockSparseAttentionWrapper.plan`` gets for one head-shared mask (on the CPU)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    M: int
    N: int
    block: int
    causal: bool
    element_mask: torch.Tensor | None


def padded_length(length: int, block: int) -> int:
    """``length`` rounded up to whole blocks."""
    return -(-length // block) * block


def _padded_key_tiles(table: BlockTable, seqlen_k: int, block: int) -> np.ndarray:
    """Per entry: whether its key block reaches past the keys (padded to a whole block)."""
    return (seqlen_k % block != 0) & (table.kv_block == table.num_k_blocks - 1)


def entry_masks(
    mask: AttnMask, table: BlockTable, block: int, entries: IntArray | None = None
) -> torch.Tensor:
    """(n, block, block) bool: attended pairs of the given tiles (all: None); padding False."""
    chosen = np.arange(len(table.kv_block)) if entries is None else entries
    rows = np.repeat(np.arange(table.num_q_blocks), np.diff(table.ptr))[chosen]
    height = torch.from_numpy(np.diff(table.q_bounds)[rows])
    width = torch.from_numpy(np.diff(table.k_bounds)[table.kv_block[chosen]])
    span = torch.arange(block)
    tiles = (
        (span[None, :] < height[:, None])[:, :, None]
        & (span[None, :] < width[:, None])[:, None, :]
        & torch.from_numpy(table.full[chosen])[:, None, None]
    )
    partial, dense = table.partial_tile_masks(mask)
    slot = np.full(len(table.kv_block), -1, dtype=np.int64)
    slot[chosen] = np.arange(len(chosen))
    mine = slot[partial] >= 0
    if mine.any():
        where = torch.from_numpy(slot[partial][mine])
        tiles[where, : dense.shape[1], : dense.shape[2]] = dense[torch.from_numpy(mine)]
    return tiles


def causal_fits(mask: AttnMask, table: BlockTable, block: int) -> bool:
    """Whether ``causal=True`` without element masks gives exactly ``mask``.

    FlashInfer's causal flag is bottom-right aligned per row block, so with R = C every touched
    tile must be full except each row block's last, on which local row r attends columns 0..r
    (checked from the mask's row intervals, never from dense tiles).
    """
    counts = np.diff(table.ptr)
    last = table.ptr[1:][counts > 0] - 1
    others = np.ones(len(table.kv_block), dtype=bool)
    others[last] = False
    if not table.full[others].all():  # early exit (the row checks below imply it)
        return False
    intervals = mask.row_intervals()
    per_row = np.diff(intervals.ptr)
    owner = np.repeat(np.arange(mask.seqlen_q), per_row)
    attended = np.bincount(
        owner, weights=intervals.ends - intervals.starts, minlength=mask.seqlen_q
    )
    last_key = np.full(mask.seqlen_q, -1, dtype=np.int64)
    last_key[per_row > 0] = intervals.ends[intervals.ptr[1:][per_row > 0] - 1] - 1
    q_block = np.arange(mask.seqlen_q) // block
    local = np.arange(mask.seqlen_q) % block
    touched = counts[q_block] > 0
    last_tile = np.zeros(table.num_q_blocks, dtype=np.int64)
    last_tile[counts > 0] = table.kv_block[last]
    want_count = (counts[q_block] - 1) * block + local + 1
    want_last = last_tile[q_block] * block + local
    # rows of untouched blocks attend nothing, and the flag gives them nothing (kv_len = 0)
    return bool(((attended == want_count) & (last_key == want_last))[touched].all())


def bsr_mode(mask: AttnMask, table: BlockTable, block: int) -> BsrMode:
    """The cheapest exact BSR form of ``mask`` on ``table`` (built on a ``block`` grid)."""
    padded = _padded_key_tiles(table, mask.seqlen_k, block)
    if table.full.all() and not padded.any():
        return "plain"
    return "causal" if causal_fits(mask, table, block) else "element"


def bsr_args(mask: AttnMask, table: BlockTable, block: int) -> BsrArgs:
    """The BSR of ``table`` padded to whole blocks, in its cheapest exact form."""
    mode = bsr_mode(mask, table, block)
    return BsrArgs(
        indptr=torch.from_numpy(table.ptr).to(torch.int32),
        indices=torch.from_numpy(table.kv_block).to(torch.int32),
        M=table.num_q_blocks * block,
        N=table.num_k_blocks * block,
        block=block,
        causal=mode == "causal",
        element_mask=entry_masks(mask, table, block) if mode == "element" else None,
    )


def head_edges(mask: AttnMask, head: int) -> tuple[IntArray, IntArray]:
    """Query and key block offsets of one head: 0, the length, and every slice edge."""
    s = mask.head_slices(head)
    q = np.unique(np.concatenate([[0, mask.seqlen_q], s[:, 0], s[:, 1]]))
    k = np.unique(np.concatenate([[0, mask.seqlen_k], s[:, 2], s[:, 3]]))
    return q.astype(np.int64), k.astype(np.int64)


def per_head_partition_reason(mask: AttnMask) -> str | None:
    """None when every head's touched tiles are full on its edge partition, else why not."""
    s = mask.slices
    rectangular = slice_areas(s) == (s[:, 1] - s[:, 0]) * (s[:, 3] - s[:, 2])
    heads = np.repeat(np.arange(mask.num_heads), np.diff(mask.head_ptr))
    for head in np.unique(heads[~rectangular]):
        table = block_table(mask.head(int(head)), *head_edges(mask, int(head)))
        partial = int((~table.full).sum())
        if partial:
            return (
                f"head {head} has {partial} partly attended tiles on its slice-edge partition; "
                "VariableBlockSparseAttentionWrapper has no element mask, so per-KV-head masks "
                "must be unions of whole rectangles (block_sparse, varblock_sparse)"
            )
    return None


def refine(edges: IntArray, count: int) -> tuple[IntArray, IntArray]:
    """Split the largest blocks of ``edges`` evenly until there are ``count``: (edges, owners)."""
    sizes = np.diff(edges)
    pieces = np.ones(len(sizes), dtype=np.int64)
    heap = [(-float(size), int(i)) for i, size in enumerate(sizes)]
    heapq.heapify(heap)
    for _ in range(count - len(sizes)):
        _, i = heapq.heappop(heap)
        pieces[i] += 1
        if pieces[i] < sizes[i]:
            heapq.heappush(heap, (-sizes[i] / pieces[i], i))
    owner = np.repeat(np.arange(len(sizes)), pieces)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    step = np.arange(len(owner)) - first  # piece index within its block
    starts = edges[owner] + (sizes[owner] * step) // pieces[owner]
    return np.append(starts, edges[-1]).astype(np.int64), owner


@dataclass(frozen=True)
class VariableArgs:
    """What ``VariableBlockSparseAttentionWrapper.plan`` gets: (Hkv, MB, NB) map and sizes."""

    block_mask_map: torch.Tensor
    block_row_sz: torch.Tensor
    block_col_sz: torch.Tensor


def variable_args(mask: AttnMask) -> VariableArgs:
    """Per-head partitions (slice edges, refined to common counts) and their touched blocks."""
    edges = [head_edges(mask, h) for h in range(mask.num_heads)]
    rows = max(len(q) - 1 for q, _ in edges)
    cols = max(len(k) - 1 for _, k in edges)
    maps, row_sz, col_sz = [], [], []
    for head, (q_edges, k_edges) in enumerate(edges):
        q_fine, q_owner = refine(q_edges, rows)
        k_fine, k_owner = refine(k_edges, cols)
        touched = block_table(mask.head(head), q_edges, k_edges).dense_blocks()[0] > 0
        maps.append(touched[torch.from_numpy(q_owner)][:, torch.from_numpy(k_owner)])
        row_sz.append(torch.from_numpy(np.diff(q_fine)))
        col_sz.append(torch.from_numpy(np.diff(k_fine)))
    return VariableArgs(
        block_mask_map=torch.stack(maps),
        block_row_sz=torch.stack(row_sz).to(torch.int32),
        block_col_sz=torch.stack(col_sz).to(torch.int32),
    )
