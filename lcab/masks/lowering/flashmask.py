"""FlashMask lowering: column-wise start/end row indices (``startend_row_indices``).

FlashMask (PaddlePaddle ``flashmask_attention``) describes a mask per *key column* j by up to
two masked row intervals, shape (batch, heads, Sk, C) int32 plus a ``causal`` flag. The kernel
applies them as **absolute row intervals** of the whole score matrix (not per lower-left /
upper-right triangle, as its docstring's wording suggests; `lcab.kernels.upstream.flashmask`
cites the lines):

* causal, C=1, ``[LTS]``: rows >= LTS are masked;
* causal, C=2, ``[LTS, LTE]``: rows in [LTS, LTE) are masked;
* non-causal, C=2, ``[LTS, UTE]``: rows >= LTS and rows < UTE are masked;
* non-causal, C=4, ``[LTS, LTE, UTS, UTE]``: rows in [LTS, LTE) and in [UTS, UTE) are masked.

``causal`` adds FlashAttention 3's causal mask, which is bottom-right aligned (column j masked
for rows i < j + Sq - Sk). The lowering uses the causal forms on square masks only, where that
is rows i < j; a rectangle (a context-parallel block) gets a non-causal form, which states the
same rows without relying on any alignment.

So a column may attend at most ``[0, UTS) ∪ [UTE, LTS) ∪ [LTE, Sq)``. The lowering reads each
column's attended rows from the transposed mask and picks the smallest form that fits every
column; a column needing more pieces makes the mask not expressible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.lowering.rows import row_intervals
from lcab.masks.lowering.varlen import NotExpressible


@dataclass(frozen=True)
class FlashMaskArgs:
    """``startend_row_indices`` of shape (1, heads, Sk, C) int32 and the ``causal`` flag."""

    startend_row_indices: np.ndarray
    causal: bool

    @property
    def layout(self) -> str:
        """Human name of the column form, e.g. 'causal [LTS]'."""
        c = self.startend_row_indices.shape[-1]
        names = {
            (True, 1): "causal [LTS]",
            (True, 2): "causal [LTS, LTE]",
            (False, 2): "[LTS, UTE]",
            (False, 4): "[LTS, LTE, UTS, UTE]",
        }
        return names[(self.causal, c)]


def to_flashmask(mask: AttnMask) -> FlashMaskArgs:
    """The smallest FlashMask column form reproducing ``mask`` exactly.

    Raises NotExpressible: some key column attends more than three separate row ranges, or
    ranges in an order the column form cannot state.
    """
    sq, sk, heads = mask.seqlen_q, mask.seqlen_k, mask.num_heads
    ci = row_intervals(mask.transpose())  # rows of the transpose = key columns
    n = np.diff(ci.ptr)
    col = np.arange(heads * sk) % sk
    first = ci.ptr[:-1]
    has = n > 0
    idx0 = np.where(has, first, 0)
    idx_last = np.where(has, ci.ptr[1:] - 1, 0)
    s0 = np.where(has, ci.starts[idx0] if len(ci.starts) else 0, 0)
    e0 = np.where(has, ci.ends[idx0] if len(ci.ends) else 0, 0)
    s_last = np.where(has, ci.starts[idx_last] if len(ci.starts) else 0, 0)
    e_last = np.where(has, ci.ends[idx_last] if len(ci.ends) else 0, 0)
    shape = (1, heads, sk)

    # the causal forms only where FlashMask's bottom-right causal is rows >= j: square masks
    lower_triangular = sq == sk and bool(np.all(~has | (s0 >= col)))
    if lower_triangular:
        # attended = [j, LTS) ∪ [LTE, Sq)
        one = (n == 0) | ((n == 1) & (s0 == col))
        if one.all():
            lts = np.where(n == 0, col, e0)
            return FlashMaskArgs(lts.reshape(*shape, 1).astype(np.int32), True)
        head_at_diag = has & (s0 == col)
        two = (
            (n == 0)
            | ((n == 1) & ((s0 == col) | (e0 == sq)))
            | ((n == 2) & (s0 == col) & (e_last == sq))
        )
        if two.all():
            lts = np.where(head_at_diag, e0, col)
            tail = has & (e_last == sq) & ~((n == 1) & head_at_diag)
            lte = np.where(tail, s_last, sq)
            return FlashMaskArgs(np.stack([lts, lte], -1).reshape(*shape, 2).astype(np.int32), True)
    if np.all(n <= 1):
        # attended = [UTE, LTS)
        ute = np.where(has, s0, 0)
        lts = np.where(has, e0, 0)
        return FlashMaskArgs(np.stack([lts, ute], -1).reshape(*shape, 2).astype(np.int32), False)
    # attended = [0, UTS) ∪ [UTE, LTS) ∪ [LTE, Sq)
    top = has & (s0 == 0)
    bottom = has & (e_last == sq) & ~((n == 1) & top)
    middle = n - top - bottom
    if (middle > 1).any():
        j = int(np.flatnonzero(middle > 1)[0])
        raise NotExpressible(
            f"key column {j % sk} attends {int(n[j])} separate row ranges; FlashMask allows at "
            f"most [0, UTS), [UTE, LTS) and [LTE, Sq)"
        )
    uts = np.where(top, e0, 0)
    lte = np.where(bottom, s_last, sq)
    mid_idx = np.where(top, first + 1, first)
    mid_idx = np.minimum(mid_idx, max(len(ci.starts) - 1, 0))
    ute = np.where(middle == 1, ci.starts[mid_idx] if len(ci.starts) else 0, uts)
    lts = np.where(middle == 1, ci.ends[mid_idx] if len(ci.ends) else 0, ute)
    out = np.stack([lts, lte, uts, ute], -1).reshape(*shape, 4).astype(np.int32)
    return FlashMaskArgs(out, False)


def flashmask_reason(mask: AttnMask) -> str | None:
    """None if ``mask`` lowers to FlashMask, else why not."""
    try:
        to_flashmask(mask)
    except NotExpressible as err:
        return str(err)
    return None
