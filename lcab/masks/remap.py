"""`remap`: the mask between two token layouts, e.g. one rank's queries and another's keys.

A layout gives, for each local position of a rank, the global token it holds (-1: padding).
The mask a CP step needs is the global mask seen through two layouts:

    local (i, j) attended  <=>  rows[i] >= 0, cols[j] >= 0 and mask(rows[i], cols[j]).

Layouts are run-length encoded into segments; every slice is cut by the segments it meets and
each piece keeps its band (shifted), exact in O(pieces). One segment a side is `restrict`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.geometry import INF, IntArray, canonical_slices, expand, kind_bands


@dataclass(frozen=True)
class Segments:
    """Runs of consecutive global tokens in a layout, sorted by global start."""

    global_start: IntArray
    global_end: IntArray
    local_start: IntArray
    length: int
    """Local length of the layout (padding included)."""

    @classmethod
    def of(cls, layout: IntArray) -> Segments:
        """Segments of a layout (-1 entries are padding and belong to no segment)."""
        tokens = np.asarray(layout, dtype=np.int64)
        real = tokens >= 0
        pos = np.flatnonzero(real)
        if len(pos) == 0:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty, len(tokens))
        g = tokens[pos]
        breaks = np.flatnonzero((np.diff(g) != 1) | (np.diff(pos) != 1)) + 1
        starts = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [len(pos)]])
        order = np.argsort(g[starts], kind="stable")
        return cls(
            global_start=g[starts][order],
            global_end=(g[ends - 1] + 1)[order],
            local_start=pos[starts][order],
            length=len(tokens),
        )


def _overlap_range(seg: Segments, lo: IntArray, hi: IntArray) -> tuple[IntArray, IntArray]:
    """Index range [first, last) of segments meeting each global interval [lo, hi)."""
    first = np.searchsorted(seg.global_end, lo, side="right")
    last = np.searchsorted(seg.global_start, hi, side="left")
    return first, np.maximum(last, first)


def _remap_slices(slices: IntArray, rows: Segments, cols: Segments) -> IntArray:
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    if len(s) == 0 or len(rows.global_start) == 0 or len(cols.global_start) == 0:
        return np.zeros((0, 5), dtype=np.int64)
    lo, hi = kind_bands(*s.T)
    r0, r1 = _overlap_range(rows, s[:, 0], s[:, 1])
    c0, c1 = _overlap_range(cols, s[:, 2], s[:, 3])
    nr, nc = r1 - r0, c1 - c0
    # (slice, row segment) pairs, then (slice, row segment, col segment) pieces
    sid, rpos = expand(nr)
    rseg = r0[sid] + rpos
    pid, cpos = expand(nc[sid])
    sid, rseg = sid[pid], rseg[pid]
    cseg = c0[sid] + cpos
    # the piece in global coordinates
    gq0 = np.maximum(s[sid, 0], rows.global_start[rseg])
    gq1 = np.minimum(s[sid, 1], rows.global_end[rseg])
    gk0 = np.maximum(s[sid, 2], cols.global_start[cseg])
    gk1 = np.minimum(s[sid, 3], cols.global_end[cseg])
    # local = global - (segment global start - segment local start), per axis
    dq = rows.global_start[rseg] - rows.local_start[rseg]
    dk = cols.global_start[cseg] - cols.local_start[cseg]
    shift = dk - dq  # j - i changes by -(dk - dq)
    p_lo = np.where(lo[sid] <= -INF, -INF, lo[sid] - shift)
    p_hi = np.where(hi[sid] >= INF, INF, hi[sid] - shift)
    return canonical_slices(gq0 - dq, gq1 - dq, gk0 - dk, gk1 - dk, p_lo, p_hi)


def remap(mask: AttnMask, rows: IntArray | Segments, cols: IntArray | Segments) -> AttnMask:
    """The mask between query layout ``rows`` and key layout ``cols`` (see module docstring).

    Per-KV-head masks keep their heads. The result carries the pattern name, parameters and
    seed but no documents (its coordinates are not a packed sequence).
    """
    row_seg = rows if isinstance(rows, Segments) else Segments.of(rows)
    col_seg = cols if isinstance(cols, Segments) else Segments.of(cols)
    if row_seg.length < 1 or col_seg.length < 1:
        raise ValueError("layouts must hold at least one position")
    parts = [_remap_slices(mask.head_slices(h), row_seg, col_seg) for h in range(mask.num_heads)]
    return AttnMask.from_head_parts(parts, row_seg.length, col_seg.length, mask)


def select_heads(mask: AttnMask, heads: list[int] | IntArray) -> AttnMask:
    """A mask holding the given mask heads, in that order (for head-sharded CP ranks)."""
    parts = [mask.head_slices(int(h)) for h in heads]
    return AttnMask.from_head_parts(
        parts, mask.seqlen_q, mask.seqlen_k, mask, doc_lengths=mask.doc_lengths
    )
