"""FlashAttention varlen lowering: ``cu_seqlens``, ``max_seqlen``, ``causal``, ``window_size``.

FlashAttention (FA2/FA3), cuDNN and TransformerEngine express a mask as independent sequences
(``cu_seqlens_q`` / ``cu_seqlens_k``) with one bottom-right aligned rule for all of them: in a
sequence of ``sq`` queries and ``sk`` keys, local query r sees local keys t with
``r + sk - sq - left <= t <= r + sk - sq + right`` (``-1`` = unbounded side; ``causal`` means
``right = 0``). The lowering is inferred from the slices, not from the pattern's name:

1. slices are grouped into sequences: overlapping query ranges (or key ranges) belong to the same
   sequence, and each group's query span and key span must pair up in increasing order;
2. gaps become sequences of their own (queries with zero keys, or keys with zero queries);
3. one (left, right) window is read off the rows and the result is checked to reproduce the
   mask's exact row intervals. Anything else raises `NotExpressible` with the reason.

Rows inside a zero-key sequence attend nothing; adapters must give them out = 0, lse = -inf.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray
from lcab.masks.lowering.rows import row_intervals


class NotExpressible(ValueError):  # noqa: N818  # reads as `except NotExpressible`
    """The mask cannot be given to a kernel in this form; the message says why."""


@dataclass(frozen=True)
class VarlenArgs:
    """Arguments of ``flash_attn_varlen_func`` (and FA3 / cuDNN varlen APIs)."""

    cu_seqlens_q: IntArray
    cu_seqlens_k: IntArray
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool
    window_size: tuple[int, int]
    """(left, right); -1 means unbounded on that side."""

    @property
    def is_single_sequence(self) -> bool:
        """True when one sequence covers everything (the non-varlen API applies)."""
        return len(self.cu_seqlens_q) == 2


def _clusters(starts: IntArray, ends: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Merge overlapping [start, end) ranges: (cluster id per range, cluster starts, ends)."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] >= reach[:-1]
    cid_sorted = np.cumsum(new) - 1
    cid = np.empty_like(cid_sorted)
    cid[order] = cid_sorted
    first = np.flatnonzero(new)
    return cid, s[first], np.maximum.reduceat(e, first)


def _sequences(mask: AttnMask) -> tuple[IntArray, IntArray]:
    """Group slices into sequences: (q_spans, k_spans), each (n, 2), in query order.

    Two slices are in one sequence when their query ranges overlap or their key ranges overlap
    (connected components, found by propagating the smallest cluster id until nothing changes).
    """
    s = mask.slices
    if len(s) == 0:
        return np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64)
    qc, _, _ = _clusters(s[:, 0], s[:, 1])
    kc, _, _ = _clusters(s[:, 2], s[:, 3])
    comp = qc.copy()
    while True:
        low_k = np.full(kc.max() + 1, len(s))
        np.minimum.at(low_k, kc, comp)
        low_q = np.full(qc.max() + 1, len(s))
        np.minimum.at(low_q, qc, low_k[kc])
        new = low_q[qc]
        if np.array_equal(new, comp):
            break
        comp = new
    ids, comp = np.unique(comp, return_inverse=True)
    spans = np.zeros((len(ids), 4), dtype=np.int64)
    spans[:, 0] = spans[:, 2] = np.iinfo(np.int64).max
    np.minimum.at(spans[:, 0], comp, s[:, 0])
    np.maximum.at(spans[:, 1], comp, s[:, 1])
    np.minimum.at(spans[:, 2], comp, s[:, 2])
    np.maximum.at(spans[:, 3], comp, s[:, 3])
    spans = spans[np.argsort(spans[:, 0])]
    if (spans[1:, 0] < spans[:-1, 1]).any():
        raise NotExpressible(
            "query rows of separate sequences interleave (a sequence's queries must be contiguous)"
        )
    if (spans[1:, 2] < spans[:-1, 3]).any():
        raise NotExpressible("sequences are not in the same order for queries and keys")
    return spans[:, 0:2], spans[:, 2:4]


def varlen_row_intervals(args: VarlenArgs, seqlen_q: int) -> tuple[IntArray, IntArray]:
    """(first, last + 1) attended key of every query row under the documented FA semantics.

    Rows that attend nothing get first == last + 1 == their sequence's key start.
    """
    cq, ck = args.cu_seqlens_q, args.cu_seqlens_k
    sq, sk = np.diff(cq), np.diff(ck)
    seq = np.repeat(np.arange(len(sq)), sq)
    r = np.arange(seqlen_q) - cq[seq]
    diag = r + sk[seq] - sq[seq]
    left, right = args.window_size
    lo = np.zeros_like(diag) if left < 0 else np.maximum(diag - left, 0)
    hi = np.full_like(diag, 0) + (
        sk[seq] - 1 if right < 0 else np.minimum(diag + right, sk[seq] - 1)
    )
    hi = np.maximum(hi, lo - 1)
    return ck[seq] + lo, ck[seq] + hi + 1


def to_varlen(mask: AttnMask) -> VarlenArgs:
    """The varlen arguments reproducing ``mask`` exactly.

    Raises NotExpressible: per-head masks, rows attending several separate key ranges, sequences
    that do not pair up, or rows that do not follow one common window.
    """
    if mask.num_heads != 1:
        raise NotExpressible(
            "varlen kernels take one mask for all heads; this mask has "
            f"{mask.num_heads} (per-KV-head block-sparse)"
        )
    ri = row_intervals(mask)
    counts = np.diff(ri.ptr)
    if counts.max(initial=0) > 1:
        row = int(np.argmax(counts > 1))
        raise NotExpressible(
            f"query row {row} attends {int(counts[row])} separate key ranges; varlen kernels "
            f"allow one contiguous range per row"
        )
    q_spans, k_spans = _sequences(mask)
    lens_q, lens_k = [], []
    pos_q = pos_k = 0
    for (q0, q1), (k0, k1) in zip(q_spans.tolist(), k_spans.tolist(), strict=True):
        if q0 > pos_q:  # queries attending nothing: a sequence with no keys
            lens_q.append(q0 - pos_q)
            lens_k.append(0)
        if k0 > pos_k:  # keys nobody attends: a sequence with no queries
            lens_q.append(0)
            lens_k.append(k0 - pos_k)
        lens_q.append(q1 - q0)
        lens_k.append(k1 - k0)
        pos_q, pos_k = q1, k1
    if pos_q < mask.seqlen_q:
        lens_q.append(mask.seqlen_q - pos_q)
        lens_k.append(0)
    if pos_k < mask.seqlen_k:
        lens_q.append(0)
        lens_k.append(mask.seqlen_k - pos_k)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)

    # Read the window off the attended rows.
    sq, sk = np.diff(cu_q), np.diff(cu_k)
    has = counts == 1
    rows = np.flatnonzero(has)
    # Global key column of every row's aligned diagonal: one repeat of a per-sequence offset.
    diag = np.arange(mask.seqlen_q, dtype=np.int64) + np.repeat(cu_k[:-1] - cu_q[:-1] + sk - sq, sq)
    left = int((diag[rows] - ri.starts).max(initial=0))
    right = int((ri.ends - 1 - diag[rows]).max(initial=0))
    if left < 0 or right < 0:
        raise NotExpressible(
            "some row's keys end before or start after its aligned diagonal; FlashAttention "
            "windows always contain the diagonal"
        )
    # A side that never binds is unbounded (-1), the way FlashAttention spells it.
    if left >= int(sk.max(initial=0)) - 1:
        left = -1
    if right != 0 and right >= int(sq.max(initial=0)) - 1:
        right = -1
    args = VarlenArgs(
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=int(sq.max(initial=0)),
        max_seqlen_k=int(sk.max(initial=0)),
        causal=right == 0,
        window_size=(left, right),
    )
    # `varlen_row_intervals` in global columns, from the diagonal already at hand.
    k_start, k_stop = np.repeat(cu_k[:-1], sq), np.repeat(cu_k[1:], sq)
    exp_first = k_start if left < 0 else np.maximum(diag - left, k_start)
    exp_last = k_stop - 1 if right < 0 else np.minimum(diag + right, k_stop - 1)
    same = (
        np.array_equal(exp_last >= exp_first, has)
        and np.array_equal(exp_first[rows], ri.starts)
        and np.array_equal(exp_last[rows] + 1, ri.ends)
    )
    if not same:
        raise NotExpressible(
            "no single (causal, window_size) reproduces every sequence: query row "
            f"{_first_mismatch(args, ri.starts, ri.ends, has)} differs "
            f"under window_size={args.window_size}"
        )
    return args


def _first_mismatch(args: VarlenArgs, starts: IntArray, ends: IntArray, has: np.ndarray) -> int:
    """First query row whose (has keys, first, end) differs from the varlen semantics."""
    first = np.zeros(len(has), dtype=np.int64)
    last = np.zeros(len(has), dtype=np.int64)
    first[has], last[has] = starts, ends - 1
    exp_first, exp_end = varlen_row_intervals(args, len(has))
    exp_has = exp_end > exp_first
    return int(np.flatnonzero((exp_has != has) | (exp_first != first) | (exp_end != last + 1))[0])


def varlen_reason(mask: AttnMask) -> str | None:
    """None if ``mask`` lowers to varlen arguments, else why not."""
    try:
        to_varlen(mask)
    except NotExpressible as err:
        return str(err)
    return None
