"""Slice geometry: every slice kind is a rectangle cut by a diagonal band.

A slice ``(q_start, q_end, k_start, k_end, kind)`` attends the pairs (i, j) of its rectangle with
``lo <= j - i <= hi`` in *global* coordinates, where the band limits follow from the kind:

==============  =========================  =========================
kind            lo                         hi
==============  =========================  =========================
full            -inf                       +inf
causal          -inf                       k_end - q_end   (bottom-right aligned)
inv_causal      k_start - q_start          +inf            (top-left aligned)
bi_causal       k_start - q_start          k_end - q_end
==============  =========================  =========================

Working with (rectangle, band) pairs makes every operation of the mask engine closed-form:
clipping a slice to a rectangle keeps its band, intersecting two slices intersects their bands,
and the area of a band inside a rectangle is a difference of two sums of clamped linear terms.
`canonical_slices` turns any (rectangle, band) pair back into at most three slices of the four
kinds, so sub-masks (context parallelism), sliding windows and transposes all reuse one routine.

All functions are vectorised over numpy ``int64`` arrays; coordinates must stay below 2**30.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

#: Stand-in for an unbounded band edge. Far beyond any coordinate (< 2**30) yet small enough
#: that ``i + INF`` cannot overflow int64.
INF = 1 << 40


class SliceKind(IntEnum):
    """Shape of a slice inside its rectangle (codes match MagiAttention's FFA attn_type_map)."""

    FULL = 0
    CAUSAL = 1
    INV_CAUSAL = 2
    BI_CAUSAL = 3


def expand(counts: IntArray) -> tuple[IntArray, IntArray]:
    """For counts c_n: (owner index n, position 0..c_n-1) of every expanded element."""
    owner = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    return owner, pos


def kind_bands(
    q_start: IntArray, q_end: IntArray, k_start: IntArray, k_end: IntArray, kind: IntArray
) -> tuple[IntArray, IntArray]:
    """Global band limits ``(lo, hi)`` of slices, with ±INF for unbounded edges."""
    has_lo = (kind == SliceKind.INV_CAUSAL) | (kind == SliceKind.BI_CAUSAL)
    has_hi = (kind == SliceKind.CAUSAL) | (kind == SliceKind.BI_CAUSAL)
    lo = np.where(has_lo, k_start - q_start, -INF).astype(np.int64)
    hi = np.where(has_hi, k_end - q_end, INF).astype(np.int64)
    return lo, hi


def _clamped_prefix(u: IntArray, width: IntArray) -> IntArray:
    """T(u) = sum_{v=0..u} clamp(v, 0, width), and 0 for u < 0 (closed form)."""
    u = np.asarray(u, dtype=np.int64)
    width = np.asarray(width, dtype=np.int64)
    tri = u * (u + 1) // 2
    sat = width * (width + 1) // 2 + (u - width) * width
    return np.where(u < 0, 0, np.where(u <= width, tri, sat))


def _count_below(a: IntArray, b: IntArray, c: IntArray, d: IntArray, t: IntArray) -> IntArray:
    """#{(i, j) in [a,b) x [c,d) : j - i <= t} for each row of the arrays."""
    t = np.clip(t, c - b, d - a)  # beyond these limits the count is 0 or the full rectangle
    width = np.maximum(d - c, 0)
    u0 = a + t - c + 1
    u1 = b - 1 + t - c + 1
    return _clamped_prefix(u1, width) - _clamped_prefix(u0 - 1, width)


def band_area(
    a: IntArray, b: IntArray, c: IntArray, d: IntArray, lo: IntArray, hi: IntArray
) -> IntArray:
    """Exact number of pairs (i, j) in [a,b) x [c,d) with lo <= j - i <= hi.

    Empty rectangles and empty bands give 0. O(1) per element.
    """
    a, b, c, d, lo, hi = (np.asarray(x, dtype=np.int64) for x in (a, b, c, d, lo, hi))
    nonempty = (b > a) & (d > c) & (hi >= lo)
    area = _count_below(a, b, c, d, hi) - _count_below(a, b, c, d, lo - 1)
    return np.where(nonempty, area, 0).astype(np.int64)


def canonical_slices(
    q_start: IntArray,
    q_end: IntArray,
    k_start: IntArray,
    k_end: IntArray,
    lo: IntArray,
    hi: IntArray,
) -> IntArray:
    """Express each (rectangle ∩ band) as at most three slices; returns an (N, 5) int64 array.

    Rows of the region are cut where its left edge turns from the rectangle's side to the band's
    diagonal (row ``ks - lo + 1``) and where its right edge turns from the diagonal to the side
    (row ``ke - hi``). Between the cuts the edges are each either straight or diagonal, which is
    exactly one of the four kinds. Empty rows at the top and bottom are dropped, so every output
    slice has an attended pair in each of its rows, and a plain causal or full region comes back
    as a single slice. Output rows keep the order of the inputs.
    """
    qs, qe, ks, ke, lo, hi = (
        np.asarray(x, dtype=np.int64) for x in (q_start, q_end, k_start, k_end, lo, hi)
    )
    # Rows whose band interval meets [ks, ke): j = i + hi >= ks and j = i + lo <= ke - 1.
    a0 = np.maximum(qs, ks - hi)
    a1 = np.minimum(qe, ke - lo)
    ok = (a1 > a0) & (ke > ks) & (hi >= lo)
    a1 = np.where(ok, a1, a0)
    i_left = np.clip(ks - lo + 1, a0, a1)  # from here on the left edge is the diagonal i + lo
    i_right = np.clip(ke - hi, a0, a1)  # from here on the right edge is the side ke - 1

    first_end = np.minimum(i_left, i_right)
    mid_start, mid_end = first_end, np.maximum(i_left, i_right)
    diag_middle = i_left <= i_right  # both edges diagonal in the middle, else both straight

    # Segment 1: left edge straight, right edge diagonal -> causal.
    seg1 = np.stack([a0, first_end, ks, first_end + hi, np.full_like(a0, SliceKind.CAUSAL)], 1)
    # Segment 2: both diagonal -> bi_causal, or both straight -> full.
    seg2 = np.stack(
        [
            mid_start,
            mid_end,
            np.where(diag_middle, mid_start + lo, ks),
            np.where(diag_middle, mid_end + hi, ke),
            np.where(diag_middle, SliceKind.BI_CAUSAL, SliceKind.FULL),
        ],
        1,
    )
    # Segment 3: left edge diagonal, right edge straight -> inv_causal.
    seg3 = np.stack([mid_end, a1, mid_end + lo, ke, np.full_like(a0, SliceKind.INV_CAUSAL)], 1)

    out = np.stack([seg1, seg2, seg3], 1).reshape(-1, 5)  # keeps input order
    keep = (out[:, 1] > out[:, 0]) & (out[:, 3] > out[:, 2])
    return np.ascontiguousarray(out[keep], dtype=np.int64)


def slice_areas(slices: IntArray) -> IntArray:
    """Exact attended area of each slice of an (N, 5) array."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    lo, hi = kind_bands(s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4])
    return band_area(s[:, 0], s[:, 1], s[:, 2], s[:, 3], lo, hi)


def clip_slices(slices: IntArray, q0: int, q1: int, k0: int, k1: int) -> IntArray:
    """The parts of ``slices`` inside the rectangle [q0,q1) x [k0,k1), in global coordinates."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    hit = (s[:, 0] < q1) & (s[:, 1] > q0) & (s[:, 2] < k1) & (s[:, 3] > k0)
    s = s[hit]
    lo, hi = kind_bands(s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4])
    return canonical_slices(
        np.maximum(s[:, 0], q0),
        np.minimum(s[:, 1], q1),
        np.maximum(s[:, 2], k0),
        np.minimum(s[:, 3], k1),
        lo,
        hi,
    )


def transpose_slices(slices: IntArray) -> IntArray:
    """Slices of the transposed mask: keys become rows, band lo <= j-i <= hi becomes -hi..-lo."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    lo, hi = kind_bands(s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4])
    new_lo = np.where(hi >= INF, -INF, -hi)
    new_hi = np.where(lo <= -INF, INF, -lo)
    return canonical_slices(s[:, 2], s[:, 3], s[:, 0], s[:, 1], new_lo, new_hi)


def row_spans(slices: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Per-row attended column spans of every slice: arrays (row, first_col, last_col).

    Costs O(total rows of all slices); meant for lowerings that are per token anyway.
    """
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    lo, hi = kind_bands(s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4])
    counts = s[:, 1] - s[:, 0]
    idx = np.repeat(np.arange(len(s)), counts)
    offsets = np.arange(counts.sum(), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    rows = s[idx, 0] + offsets
    first = np.maximum(s[idx, 2], rows + lo[idx])
    last = np.minimum(s[idx, 3] - 1, rows + hi[idx])
    keep = first <= last
    return rows[keep], first[keep], last[keep]
