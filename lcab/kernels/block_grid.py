"""The mask check every library block-sparse kernel shares: whether all touched tiles are full.

A kernel without per-element masks computes every selected tile whole, so it is exact only when
every tile the mask touches is completely attended; otherwise the first partial tile is named.
"""

from __future__ import annotations

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.lowering.blocks import BlockTable, block_table


def partial_tile_reason(mask: AttnMask, block_q: int, block_k: int) -> str | None:
    """None when every touched tile of ``mask`` on a (block_q, block_k) grid is full, else why."""
    return partial_tile_reason_of(block_table(mask, block_q, block_k), block_q, block_k)


def partial_tile_reason_of(table: BlockTable, block_q: int, block_k: int) -> str | None:
    """`partial_tile_reason` for a block table already built on that grid."""
    partial = np.flatnonzero(~table.full)
    if len(partial) == 0:
        return None
    entry = int(partial[0])
    row = int(np.searchsorted(table.ptr, entry, side="right") - 1)
    head, q_block = divmod(row, table.num_q_blocks)
    return (
        f"{len(partial)} of the {len(table.full)} touched {block_q}x{block_k} tiles are only "
        f"partly attended (first: head {head}, query block {q_block}, key block "
        f"{int(table.kv_block[entry])}); this kernel computes whole tiles, so it is exact only "
        f"for masks made of full {block_q}x{block_k} blocks (block_sparse with "
        f"block_size={block_q})"
    )
