"""Per-row key intervals for the per-token lowerings, without a sort when rows do not overlap.

`AttnMask.row_intervals` sorts every (row, span) pair so that rows met by several slices can be
merged. Most masks at paper scale (documents, causal, sliding windows) give each query row to
one slice per head; then the spans come out of the slices already in row order, one per row,
and the sort (half the cost of a 1M-token varlen or FlashMask lowering) can be skipped. The
result is the same `RowIntervals`, array for array.
"""

from __future__ import annotations

import numpy as np

from lcab.masks.core import AttnMask, RowIntervals
from lcab.masks.geometry import IntArray, kind_bands


def row_intervals(mask: AttnMask) -> RowIntervals:
    """Exactly ``mask.row_intervals()``; faster when no query row meets two slices of a head."""
    rows_all, first_all, last_all = [], [], []
    for h in range(mask.num_heads):
        s = mask.head_slices(h)
        s = s[np.argsort(s[:, 0], kind="stable")]
        if (s[1:, 0] < s[:-1, 1]).any():  # some row meets two slices: spans need merging
            return mask.row_intervals()
        rows, first, last = _spans(s)
        rows_all.append(rows + h * mask.seqlen_q)
        first_all.append(first)
        last_all.append(last)
    rows = np.concatenate(rows_all)
    n_rows = mask.num_heads * mask.seqlen_q
    ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))])
    return RowIntervals(
        ptr.astype(np.int64), np.concatenate(first_all), np.concatenate(last_all) + 1
    )


def _spans(s: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """`geometry.row_spans` of slices, as per-slice ``repeat`` s instead of per-row gathers."""
    lo, hi = kind_bands(s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4])
    counts = s[:, 1] - s[:, 0]
    total = int(counts.sum())
    rows = np.repeat(s[:, 0] - (np.cumsum(counts) - counts), counts) + np.arange(
        total, dtype=np.int64
    )
    first = np.maximum(np.repeat(s[:, 2], counts), rows + np.repeat(lo, counts))
    last = np.minimum(np.repeat(s[:, 3] - 1, counts), rows + np.repeat(hi, counts))
    keep = first <= last
    if keep.all():
        return rows, first, last
    return rows[keep], first[keep], last[keep]
