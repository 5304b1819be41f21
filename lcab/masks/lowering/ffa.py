"""MagiAttention FFA lowering: the slices as ``q_ranges``, ``k_ranges`` and ``attn_type_map``.

FFA consumes lcab's slice form and kind codes: a copy in FFA's dtypes, tested as every form is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.lowering.varlen import NotExpressible


@dataclass(frozen=True)
class FFAArgs:
    """``flex_flash_attn_func`` mask arguments (int32, on the host)."""

    q_ranges: np.ndarray
    k_ranges: np.ndarray
    attn_type_map: np.ndarray


def to_ffa(mask: AttnMask) -> FFAArgs:
    """FFA arguments of a head-shared mask.

    Raises NotExpressible: per-KV-head masks (FFA takes one slice list for all heads).
    """
    if mask.num_heads != 1:
        raise NotExpressible(
            f"FFA takes one slice list for all heads; this mask has {mask.num_heads} heads"
        )
    s = mask.slices
    return FFAArgs(
        q_ranges=np.ascontiguousarray(s[:, 0:2], dtype=np.int32),
        k_ranges=np.ascontiguousarray(s[:, 2:4], dtype=np.int32),
        attn_type_map=np.ascontiguousarray(s[:, 4], dtype=np.int32),
    )
