"""``sparse``: block-sparse attention over the block-table lowering (the FA2-Sparse way).

Query blocks are the work items; consecutive full key blocks merge into one piece, partial tiles
are masked by their dense tile mask. It computes every touched tile whole — the waste the
benchmark measures against ``ranges`` — on the tiled engine (`lcab.kernels.tiled`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from typing_extensions import override

from lcab.kernels.base import Kernel, PreparedAttention, Problem, torch_caps
from lcab.kernels.registry import register_kernel
from lcab.kernels.tiled import PreparedTiled, WorkItems, plan_for
from lcab.masks.core import AttnMask
from lcab.masks.geometry import INF
from lcab.masks.lowering.blocks import block_table


def block_items(mask: AttnMask, block_size: int) -> WorkItems:
    """Work items of ``mask`` on a uniform ``block_size`` grid: one per touched query block."""
    table = block_table(mask, block_size, block_size)
    if len(table.kv_block) == 0:  # nothing attended (e.g. an empty context-parallel block)
        empty = np.zeros(0, dtype=np.int64)
        return WorkItems(
            empty, empty, empty, np.zeros(1, np.int64), empty, empty, empty, empty, empty
        )
    partial, tiles = table.partial_tile_masks(mask)
    slot = np.full(len(table.full), -1, dtype=np.int64)
    slot[partial] = np.arange(len(partial))
    n_rows = len(table.ptr) - 1
    row = np.repeat(np.arange(n_rows), np.diff(table.ptr))
    kv, full = table.kv_block, table.full
    # A piece starts at every partial tile and wherever a run of consecutive full blocks breaks.
    start = np.ones(len(kv), dtype=bool)
    start[1:] = ~(full[1:] & full[:-1] & (row[1:] == row[:-1]) & (kv[1:] == kv[:-1] + 1))
    first = np.flatnonzero(start)
    last = np.append(first[1:], len(kv)) - 1
    piece_row = row[first]
    used, counts = np.unique(piece_row, return_counts=True)
    n_pieces = len(first)
    return WorkItems(
        head=used // table.num_q_blocks,
        q0=table.q_bounds[used % table.num_q_blocks],
        q1=table.q_bounds[used % table.num_q_blocks + 1],
        ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        k0=table.k_bounds[kv[first]],
        k1=table.k_bounds[kv[last] + 1],
        lo=np.full(n_pieces, -INF, dtype=np.int64),
        hi=np.full(n_pieces, INF, dtype=np.int64),
        tile=np.where(full[first], -1, slot[first]),
        tiles=tiles.numpy(),
    )


@dataclass
class SparseOptions:
    """Options of the sparse kernel."""

    block_size: int = 128
    """Query and key block size of the block table (Bq = Bk)."""


@register_kernel
class SparseKernel(Kernel):
    """Block-sparse tiled attention over the block table; option ``block_size`` (default 128)."""

    name = "sparse"
    colour = "#843c39"
    summary = "block-sparse tiles from the block table (full tiles unmasked), fwd+bwd"
    options_cls = SparseOptions
    caps = torch_caps("block_table")  # the tiled engine is plain torch ops

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        items = block_items(mask, int(self.options["block_size"]))
        return PreparedTiled(plan_for(mask, problem, items))
