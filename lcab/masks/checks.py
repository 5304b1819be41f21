"""Checks of a slice set: bounds, kinds, emptiness and, above all, disjointness.

Slices must never overlap, or their shared pairs would be counted twice in ``area()`` and in
FLOPs. `validate_slices` runs on every mask built from user input (`AttnMask(validate=True)`);
masks derived in closed form from a valid one (restrict, transpose, remap) skip it.
"""

from __future__ import annotations

import numpy as np

from lcab.masks.geometry import IntArray, SliceKind, band_area, kind_bands, slice_areas


def validate_slices(slices: IntArray, head_ptr: IntArray, seqlen_q: int, seqlen_k: int) -> None:
    """Raise ValueError naming the first invalid slice (or pair of overlapping slices).

    ``slices`` and ``head_ptr`` as `lcab.masks.AttnMask` holds them.
    """
    s = slices
    num_heads = len(head_ptr) - 1
    qs, qe, ks, ke, kind = s.T
    bad_kind = ~np.isin(kind, [k.value for k in SliceKind])
    bad_q = (qs < 0) | (qe > seqlen_q) | (qs >= qe)
    bad_k = (ks < 0) | (ke > seqlen_k) | (ks >= ke)
    for flag, what in (
        (bad_kind, "kind must be 0 (full), 1 (causal), 2 (inv_causal) or 3 (bi_causal)"),
        (bad_q, f"q range must satisfy 0 <= q_start < q_end <= seqlen_q={seqlen_q}"),
        (bad_k, f"k range must satisfy 0 <= k_start < k_end <= seqlen_k={seqlen_k}"),
    ):
        if flag.any():
            i = int(np.flatnonzero(flag)[0])
            raise ValueError(f"slice {i} {s[i].tolist()} is invalid: {what}")
    empty = slice_areas(s) == 0
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise ValueError(
            f"slice {i} {s[i].tolist()} attends nothing (a bi_causal slice needs "
            f"k_end - k_start >= q_end - q_start); drop it"
        )
    for h in range(num_heads):
        base = int(head_ptr[h])
        pair = first_overlap(s[base : int(head_ptr[h + 1])])
        if pair is not None:
            i, j = pair
            head = f" of head {h}" if num_heads > 1 else ""
            raise ValueError(
                f"slices {base + i} {s[base + i].tolist()} and {base + j} "
                f"{s[base + j].tolist()}{head} overlap: slices must be disjoint, or their "
                f"shared pairs would be counted twice in area() and FLOPs"
            )


def _pairs_below(key: IntArray, limit: IntArray) -> tuple[IntArray, IntArray]:
    """All (x, y), x < y, with key[y] < limit[x]; ``key`` must be sorted ascending."""
    stop = np.searchsorted(key, limit, side="left")
    count = np.maximum(stop - np.arange(len(key)) - 1, 0)
    xs = np.repeat(np.arange(len(key)), count)
    ys = xs + 1 + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    return xs, ys


def first_overlap(slices: IntArray) -> tuple[int, int] | None:
    """Indices of two slices sharing an attended pair, or None if all are disjoint.

    Candidate pairs are slices whose rectangles intersect; each is then decided exactly by the
    area of the intersection of both bands inside both rectangles. Candidates are enumerated
    within groups of equal q ranges (or equal k ranges) when those groups are disjoint, which
    is the layout of every generated mask and keeps the check near-linear.
    """
    s = np.asarray(slices, dtype=np.int64)
    if len(s) < 2:
        return None
    for q_cols, k_cols in (((0, 1), (2, 3)), ((2, 3), (0, 1))):
        grouped = _grouped_candidates(s, q_cols, k_cols)
        if grouped is not None:
            xs, ys = grouped
            break
    else:
        order = np.argsort(s[:, 0], kind="stable")
        t = s[order]
        xs, ys = _pairs_below(t[:, 0], t[:, 1])
        keep = (t[ys, 2] < t[xs, 3]) & (t[xs, 2] < t[ys, 3])
        xs, ys = order[xs[keep]], order[ys[keep]]
    if len(xs) == 0:
        return None
    a, b = s[xs], s[ys]
    lo_a, hi_a = kind_bands(*a.T)
    lo_b, hi_b = kind_bands(*b.T)
    shared = band_area(
        np.maximum(a[:, 0], b[:, 0]),
        np.minimum(a[:, 1], b[:, 1]),
        np.maximum(a[:, 2], b[:, 2]),
        np.minimum(a[:, 3], b[:, 3]),
        np.maximum(lo_a, lo_b),
        np.minimum(hi_a, hi_b),
    )
    hit = np.flatnonzero(shared > 0)
    if len(hit) == 0:
        return None
    i, j = int(xs[hit[0]]), int(ys[hit[0]])
    return (min(i, j), max(i, j))


def _grouped_candidates(
    s: IntArray, group_cols: tuple[int, int], other_cols: tuple[int, int]
) -> tuple[IntArray, IntArray] | None:
    """Overlap candidates when distinct ranges on ``group_cols`` are disjoint, else None."""
    g0, g1 = s[:, group_cols[0]], s[:, group_cols[1]]
    uniq, inverse = np.unique(np.stack([g0, g1], 1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    if len(uniq) > 1 and (uniq[1:, 0] < uniq[:-1, 1]).any():
        return None  # some distinct ranges overlap: groups do not separate the candidates
    o0, o1 = s[:, other_cols[0]], s[:, other_cols[1]]
    span = int(max(o1.max(), 1)) + 1
    key = inverse * span + o0
    order = np.argsort(key, kind="stable")
    xs, ys = _pairs_below(key[order], (inverse * span + o1)[order])
    return order[xs], order[ys]
