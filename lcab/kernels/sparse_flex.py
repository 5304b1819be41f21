"""FlexAttention as a plain block-sparse kernel: whole tiles from lcab's block table, no mask_mod.

The paper's "Flex" block-sparse entry: ``BlockMask.from_kv_blocks`` on a ``block_size`` grid,
every selected tile a full block, so only masks whose touched tiles are all full run
(`partial_tile_reason`). Per-KV-head masks are expanded to query heads, as in ``flex``. Flex's
eager path evaluates only ``mask_mod``, so there the BlockMask carries a tile-lookup
``mask_mod`` selecting the same tiles (`full_tile_block_mask`); compiled, it is never evaluated.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lcab.kernels.base import Problem
from lcab.kernels.block_grid import partial_tile_reason_of
from lcab.kernels.flex import FLEX_CAPS, FlexFamily
from lcab.kernels.registry import register_kernel
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering.blocks import BlockTable, block_table
from lcab.masks.lowering.flex import MaskMod

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def selected_tiles(table: BlockTable, heads_q: int) -> torch.Tensor:
    """Bool (H, nq, nk): the tiles computed per BlockMask head (1 for a head-shared table)."""
    selected = table.dense_blocks() > 0  # every touched tile (callers check they are full)
    if table.num_heads > 1:
        selected = selected.repeat_interleave(heads_q // table.num_heads, 0)
    return selected


def full_block_indices(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flex's (full_kv_num_blocks (1, H, nq), full_kv_indices (1, H, nq, nk)): selected first."""
    num = selected.sum(-1, dtype=torch.int32)
    order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True)
    return num.unsqueeze(0), order.to(torch.int32).unsqueeze(0)


def tile_lookup_mask_mod(selected: torch.Tensor, block: int) -> MaskMod:
    """A ``mask_mod`` that is True exactly on the selected tiles (for Flex's eager path only)."""
    shared = selected.shape[0] == 1

    def tile_selected(
        b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return selected[0 if shared else h, q_idx // block, kv_idx // block]

    return tile_selected


def full_tile_block_mask(
    mask: AttnMask,
    table: BlockTable,
    heads_q: int,
    block_size: int,
    device: torch.device,
    *,
    eager: bool = False,
) -> torch.nn.attention.flex_attention.BlockMask:
    """The BlockMask of ``table``: every selected tile a full block, no partial blocks.

    Compiled, the ``mask_mod`` is never evaluated; eager evaluates only it, so it looks tiles up.
    """
    from torch.nn.attention.flex_attention import BlockMask

    selected = selected_tiles(table, heads_q)
    full_num, full_idx = full_block_indices(selected)
    return BlockMask.from_kv_blocks(
        torch.zeros_like(full_num).to(device),  # no partial tiles: nothing for a mask_mod
        torch.zeros_like(full_idx).to(device),
        full_num.to(device),
        full_idx.to(device),
        BLOCK_SIZE=(block_size, block_size),
        mask_mod=tile_lookup_mask_mod(selected.to(device), block_size) if eager else None,
        seq_lengths=(mask.seqlen_q, mask.seqlen_k),
    )


@register_kernel
class SparseFlexKernel(FlexFamily):
    """FlexAttention on full tiles only (block-sparse); options: compile, block_size (128)."""

    name = "sparse_flex"
    colour = "#6b6ecf"
    summary = "FlexAttention block-sparse: full tiles from the block table, no mask_mod"
    caps = dataclasses.replace(FLEX_CAPS, lowering="block_table")

    @override
    def mask_reasons(self, mask: AttnMask) -> list[str]:
        block = int(self.options["block_size"])
        why = partial_tile_reason_of(block_table(mask, block, block), block, block)
        return super().mask_reasons(mask) + ([why] if why else [])

    @override
    def block_mask(self, mask: AttnMask, problem: Problem) -> Any:
        block = int(self.options["block_size"])
        table = block_table(mask, block, block)
        eager = not self.options["compile"]
        return full_tile_block_mask(
            mask, table, problem.heads_q, block, problem.torch_device, eager=eager
        )
