"""``ranges``: attention planned straight from the slices (portable twin of MagiAttention's FFA).

Each mask head's rows are cut at every slice boundary and into chunks of at most ``tile`` rows;
a chunk attends one contiguous key segment per covering slice, whose band binds only in
``tile``-wide corners, which the tiled engine (`lcab.kernels.tiled`) masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from typing_extensions import override

from lcab.kernels.base import Kernel, PreparedAttention, Problem, torch_caps
from lcab.kernels.registry import register_kernel
from lcab.kernels.tiled import PreparedTiled, WorkItems, plan_for
from lcab.masks.core import AttnMask
from lcab.masks.geometry import kind_bands

#: Default rows per work item: on 2 CPU cores (causal_document, S=16K) 64 was slower (small
#: GEMMs) and 256 wasted more of the diagonal triangles.
DEFAULT_TILE = 128


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, position) of every element when owner n is repeated counts[n] times."""
    owner = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    return owner, pos


def range_items(mask: AttnMask, tile: int) -> WorkItems:
    """Work items of ``mask``: row chunks of ≤ ``tile`` rows between slice q-boundaries.

    Vectorised over slices: cost O(slices x chunks they cover), independent of the area.
    """
    if tile < 1:
        raise ValueError(f"tile={tile} must be >= 1")
    heads, q0s, q1s, counts = [], [], [], []
    pieces: list[np.ndarray] = []
    for h in range(mask.num_heads):
        s = mask.head_slices(h)
        if len(s) == 0:
            continue
        lo, hi = kind_bands(*s.T)
        bounds = np.unique(np.concatenate([s[:, 0], s[:, 1]]))
        g0 = np.searchsorted(bounds, s[:, 0])
        g1 = np.searchsorted(bounds, s[:, 1])
        sid, pos = _expand(g1 - g0)  # (group, slice) pairs: the slice covers the group's rows
        grp = g0[sid] + pos
        chunks_per_group = -(-np.diff(bounds) // tile)
        first_chunk = np.cumsum(chunks_per_group) - chunks_per_group
        pair, j = _expand(chunks_per_group[grp])
        sid, grp = sid[pair], grp[pair]
        r0 = bounds[grp] + j * tile
        r1 = np.minimum(r0 + tile, bounds[grp + 1])
        chunk = first_chunk[grp] + j
        k_first = np.maximum(s[sid, 2], r0 + lo[sid])
        k_last = np.minimum(s[sid, 3] - 1, r1 - 1 + hi[sid])
        keep = k_first <= k_last
        chunk, sid, r0, r1 = chunk[keep], sid[keep], r0[keep], r1[keep]
        k_first, k_last = k_first[keep], k_last[keep]
        order = np.lexsort((k_first, chunk))
        chunk, sid, r0, r1 = chunk[order], sid[order], r0[order], r1[order]
        k_first, k_last = k_first[order], k_last[order]
        new = np.ones(len(chunk), dtype=bool)
        new[1:] = chunk[1:] != chunk[:-1]
        starts = np.flatnonzero(new)
        heads.append(np.full(len(starts), h, dtype=np.int64))
        q0s.append(r0[starts])
        q1s.append(r1[starts])
        counts.append(np.diff(np.append(starts, len(chunk))))
        pieces.append(np.stack([k_first, k_last + 1, lo[sid], hi[sid]], 1))
    if not pieces:
        empty = np.zeros(0, dtype=np.int64)
        return WorkItems(
            empty, empty, empty, np.zeros(1, np.int64), empty, empty, empty, empty, empty
        )
    p = np.concatenate(pieces)
    n = np.concatenate(counts)
    return WorkItems(
        head=np.concatenate(heads),
        q0=np.concatenate(q0s),
        q1=np.concatenate(q1s),
        ptr=np.concatenate([[0], np.cumsum(n)]).astype(np.int64),
        k0=p[:, 0].copy(),
        k1=p[:, 1].copy(),
        lo=p[:, 2].copy(),
        hi=p[:, 3].copy(),
        tile=np.full(len(p), -1, dtype=np.int64),
    )


@dataclass
class RangesOptions:
    """Options of the ranges kernel."""

    tile: int = DEFAULT_TILE
    """Most query rows per work item (the height of the wasted staircase on a diagonal)."""


@register_kernel
class RangesKernel(Kernel):
    """Slice-driven tiled attention; option ``tile`` (rows per work item, default 128)."""

    name = "ranges"
    colour = "#e377c2"
    summary = "tiled attention planned from the slices (FFA-style), fwd+bwd, any device"
    options_cls = RangesOptions
    caps = torch_caps("ranges")  # the tiled engine is plain torch ops

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        tile = int(self.options["tile"])
        return PreparedTiled(plan_for(mask, problem, range_items(mask, tile)))
