"""Lowerings: every kernel family's form of a mask, derived from the slices.

Each lowering is a pure function of an `AttnMask`, tested against `AttnMask.to_dense`. Kernels
declare the one they consume (`KernelCaps.lowering`); `lowering_reason` says whether a mask is
expressible in it, so unsupported cells are found without running anything (masks guide,
"Lowerings").
"""

from __future__ import annotations

from collections.abc import Callable

from lcab.masks.core import AttnMask
from lcab.masks.lowering.blocks import BlockTable, block_table, uniform_bounds
from lcab.masks.lowering.ffa import FFAArgs, to_ffa
from lcab.masks.lowering.flashmask import FlashMaskArgs, flashmask_reason, to_flashmask
from lcab.masks.lowering.flex import FlexMaskMod, flex_block_mask, flex_mask_mod
from lcab.masks.lowering.varlen import NotExpressible, VarlenArgs, to_varlen, varlen_reason


def _always(mask: AttnMask) -> str | None:
    return None


def _single_head(mask: AttnMask) -> str | None:
    if mask.num_heads != 1:
        return f"needs one mask for all heads; this mask has {mask.num_heads} (per KV head)"
    return None


#: Lowering name → function returning None if the mask is expressible, else the reason.
LOWERING_REASONS: dict[str, Callable[[AttnMask], str | None]] = {
    "dense": _always,
    "ranges": _always,
    "flex": _always,
    "block_table": _always,
    "varlen": varlen_reason,
    "flashmask": flashmask_reason,
    "ffa": _single_head,
}


def lowering_reason(mask: AttnMask, lowering: str) -> str | None:
    """None if ``mask`` can be lowered to ``lowering``, else a human-readable reason."""
    if lowering not in LOWERING_REASONS:
        raise ValueError(f"lowering={lowering!r} is unknown; valid: {', '.join(LOWERING_REASONS)}")
    return LOWERING_REASONS[lowering](mask)


__all__ = [
    "LOWERING_REASONS",
    "BlockTable",
    "FFAArgs",
    "FlashMaskArgs",
    "FlexMaskMod",
    "NotExpressible",
    "VarlenArgs",
    "block_table",
    "flashmask_reason",
    "flex_block_mask",
    "flex_mask_mod",
    "lowering_reason",
    "to_ffa",
    "to_flashmask",
    "to_varlen",
    "uniform_bounds",
    "varlen_reason",
]
