"""FlashMask V3 adapter, through the PyTorch build of PaddlePaddle/flash-attention's FlashMask.

PaddlePaddle's own ``paddle.nn.functional.flashmask_attention`` needs Paddle 3.x GPU wheels,
which PyPI does not serve (its ``paddlepaddle-gpu`` 2.6.2 predates FlashMask), and it would time
Paddle tensors copied out of torch. The repository's ``flashmask_attention_v3/setup_torch.py``
builds the same kernel as a torch extension (distribution ``flashmask`` 3.0.0b1, module
``flashmask_interface``); this adapter is written against that module's documented
``flashmask_attention`` and is **CPU contract-tested only** (stand-in module, never the CUDA
kernel). The first GPU run must confirm it.

The mask is lowered once, in `prepare`, by `lcab.masks.lowering.to_flashmask`: int32
``startend_row_indices`` (1, H_mask, Sk, C) with H_mask 1 or Hkv (per-KV-head masks are
native) and the ``causal`` flag, on the device. The call takes (1, S, H, D) views.

What lcab refuses rather than guesses (`mask_reasons`, checked before any run):

* FlashMask's docstring applies [LTS, LTE) to the *lower-left triangle* and [UTS, UTE) to the
  *upper-right triangle* of the score matrix without saying which one owns the diagonal, while
  lcab's lowering states absolute row intervals. A mask is claimed only when every column's
  intervals give the same mask under both readings (diagonal in either triangle). Where the
  lowering's form is ambiguous (a column no row attends, say), the adapter passes the
  equivalent non-causal 4-column form that states each triangle's masked rows exactly
  (`flashmask_args`); a column whose masked rows on one side of the diagonal are not one
  interval is refused;
* rectangles (Sq != Sk, context-parallel blocks): the triangles and ``causal`` are documented
  for square score matrices only.

The module reads ``FLAGS_flash_attn_version`` with ``int(os.getenv(...))`` and needs it to be
3; `prepare` sets it when unset, and another value is a reason.

LSE: ``return_softmax_lse=True`` → ``[out, lse]``, natural log (FA3-derived), taken to be
(B, Hq, Sq) like FA3's dense call — unconfirmed, so `lse_to_lcab` refuses any other shape
rather than transpose silently. Rows attending no key get lcab's out 0 / lse -inf from the
mask. Backward: autograd through ``out`` (FlashMask's autograd function ignores the LSE's
gradient, so ``stats_backward=False``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from typing_extensions import override

from lcab.kernels.base import (
    Kernel,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
    empty_rows,
)
from lcab.kernels.library_results import to_lcab_convention
from lcab.kernels.probe import ApiNeed, PackageProbe, probe_reasons
from lcab.kernels.registry import register_kernel
from lcab.masks.core import AttnMask
from lcab.masks.lowering import FlashMaskArgs, lowering_reason, to_flashmask

#: Keywords the adapter passes to ``flashmask_attention`` (after q, k, v by position).
FLASHMASK_KWARGS = ("startend_row_indices", "causal", "return_softmax_lse", "softmax_scale")
VERSION_FLAG = "FLAGS_flash_attn_version"
FOLLOWS = "the torch build of FlashMask V3, flashmask 3.0.0b1"


def _intervals(args: FlashMaskArgs, sq: int) -> tuple[np.ndarray, ...]:
    """(LTS, LTE, UTS, UTE) per (head, column) of any of the four column forms."""
    idx = args.startend_row_indices[0].astype(np.int64)  # (H, Sk, C)
    none, whole = np.zeros_like(idx[..., 0]), np.full_like(idx[..., 0], sq)
    if args.causal:
        lte = idx[..., 1] if idx.shape[-1] == 2 else whole
        return idx[..., 0], lte, none, none
    if idx.shape[-1] == 2:
        return idx[..., 0], whole, none, idx[..., 1]
    return idx[..., 0], idx[..., 1], idx[..., 2], idx[..., 3]


def triangle_reason(args: FlashMaskArgs, sq: int) -> str | None:
    """None if the column form means the same with the diagonal in either triangle, else why.

    With lower = rows >= j + d and upper = rows < j + d (d = 0 or 1), the documented mask of
    column j is (L ∩ lower) ∪ (U ∩ upper) (plus rows < j when causal), the lowering's is L ∪ U:
    they agree when L ∩ upper is covered by U (by causality when causal) and U ∩ lower by L.
    """
    lts, lte, uts, ute = _intervals(args, sq)
    j = np.arange(lts.shape[-1])[None, :]
    bad = np.zeros(lts.shape, dtype=bool)
    for d in (0, 1):
        x_lo, x_hi = lts, np.minimum(lte, j + d)  # L ∩ upper
        if args.causal:  # rows < j are masked anyway: what is left is L ∩ [j, j + d)
            bad |= np.maximum(x_lo, j) < x_hi
            continue
        bad |= (x_lo < x_hi) & ~((uts <= x_lo) & (ute >= x_hi))
        y_lo, y_hi = np.maximum(uts, j + d), ute  # U ∩ lower
        bad |= (y_lo < y_hi) & ~((lts <= y_lo) & (lte >= y_hi))
    if not bad.any():
        return None
    head, col = (int(x) for x in np.argwhere(bad)[0])
    return (
        f"key column {col} (mask head {head}) has masked rows crossing the diagonal in "
        f"{args.layout}; FlashMask documents its intervals per lower-left / upper-right "
        "triangle without saying which owns the diagonal, so lcab does not guess"
    )


def _union(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], none: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, ok): union of two intervals per column, ``ok`` False where it is not one."""
    a_has, b_has = a[0] < a[1], b[0] < b[1]
    lo = np.where(a_has & b_has, np.minimum(a[0], b[0]), np.where(a_has, a[0], b[0]))
    hi = np.where(a_has & b_has, np.maximum(a[1], b[1]), np.where(a_has, a[1], b[1]))
    ok = ~(a_has & b_has) | (np.maximum(a[0], b[0]) <= np.minimum(a[1], b[1]))
    empty = ~(a_has | b_has)
    return np.where(empty, none, lo), np.where(empty, none, hi), ok


def _per_triangle(args: FlashMaskArgs, sq: int) -> tuple[FlashMaskArgs, np.ndarray]:
    """The same mask as non-causal [LTS, LTE, UTS, UTE] whichever triangle owns the diagonal.

    Under either reading, [LTS, LTE) must equal the masked rows >= j of column j (within rows
    >= j) and [UTS, UTE) the masked rows <= j (within rows <= j); so take exactly those, which
    is possible where each is one interval: the second result marks the (head, column) pairs
    where it is not. Causal masks rows < j as part of the upper interval (square matrices only).
    """
    lts, lte, uts, ute = _intervals(args, sq)
    j = np.broadcast_to(np.arange(lts.shape[-1])[None, :], lts.shape)
    if args.causal:
        uts, ute = np.zeros_like(uts), j.copy()
    low = _union((np.maximum(lts, j), lte), (np.maximum(uts, j), ute), sq)
    up = _union((lts, np.minimum(lte, j + 1)), (uts, np.minimum(ute, j + 1)), 0)
    four = np.stack([low[0], low[1], up[0], up[1]], -1)[None].astype(np.int32)
    return FlashMaskArgs(four, False), ~(low[2] & up[2])


def flashmask_args(mask: AttnMask) -> tuple[FlashMaskArgs, str | None]:
    """The column form the adapter passes, and why it cannot be passed (None: it can).

    The lowering's own form when it means the same under both readings of the diagonal, else
    the per-triangle 4-column form (`_per_triangle`). Square masks only.
    """
    args = to_flashmask(mask)
    if triangle_reason(args, mask.seqlen_q) is None:
        return args, None
    four, split = _per_triangle(args, mask.seqlen_q)
    if not split.any():
        return four, triangle_reason(four, mask.seqlen_q)
    head, col = (int(x) for x in np.argwhere(split)[0])
    return four, (
        f"key column {col} (mask head {head}) has masked rows in two pieces on one side of "
        "the diagonal; FlashMask documents one interval per lower-left / upper-right triangle "
        "without saying which owns the diagonal, so lcab does not guess"
    )


def mask_reasons(mask: AttnMask) -> list[str]:
    """Reasons beyond the lowering's: rectangles, and intervals ambiguous at the diagonal."""
    if mask.seqlen_q != mask.seqlen_k:
        return [
            f"FlashMask documents its triangles and causal for square score matrices only "
            f"(this mask is {mask.seqlen_q} x {mask.seqlen_k})"
        ]
    if lowering_reason(mask, "flashmask") is not None:
        return []  # the base class already reports it
    why = flashmask_args(mask)[1]
    return [] if why is None else [why]


class _PreparedFlashMask(PreparedAttention):
    """The column indices on the device, the call's keywords, and the empty rows."""

    layout = "shd"

    def __init__(self, mask: AttnMask, problem: Problem, fn: Callable[..., Any]) -> None:
        args = flashmask_args(mask)[0]
        self.fn = fn
        self.heads, self.seqlen = problem.heads_q, problem.seqlen_q
        indices = torch.from_numpy(np.ascontiguousarray(args.startend_row_indices))
        self.kwargs: dict[str, Any] = {
            "startend_row_indices": indices.to(torch.int32).to(problem.device).contiguous(),
            "causal": bool(args.causal),
            "return_softmax_lse": True,
            "softmax_scale": problem.head_dim**-0.5,
        }
        empty = empty_rows(mask)  # (H_mask, Sq) → one row per query head
        group = problem.heads_q // mask.num_heads
        self.empty = empty.repeat_interleave(group, 0).to(problem.device)
        self.has_empty = bool(self.empty.any())

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        result = self.fn(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), **self.kwargs)
        return to_lcab_convention(
            result[0].squeeze(0),
            result[1],
            "bhs",
            heads=self.heads,
            seqlen=self.seqlen,
            empty=self.empty if self.has_empty else None,
            dtype=q.dtype,
            library="FlashMask",
            follows=FOLLOWS,
        )


@register_kernel
class FlashMaskKernel(Kernel):
    """FlashMask V3 (torch build), column-wise row intervals (CPU contract-tested)."""

    name = "flashmask"
    summary = "FlashMask V3 (torch build), column-wise row intervals"
    caps = cuda_adapter_caps(
        "flashmask",
        max_head_dim=256,
        per_head_masks=True,
        package="flashmask_interface",
        pip_name=(
            "flashmask, the torch build of PaddlePaddle/flash-attention's "
            "flashmask/flash_mask/flashmask_attention_v3/setup_torch.py; PyPI's "
            "paddlepaddle-gpu 2.6.2 predates FlashMask"
        ),
        min_compute_capability=(9, 0),
    )
    probe: ClassVar[PackageProbe] = PackageProbe(
        module="flashmask_interface",
        distributions=("flashmask",),
        needs=(ApiNeed("flashmask_attention", FLASHMASK_KWARGS, positional=3),),
        min_version="3.0",
        requirement="the torch build of FlashMask V3, flashmask >= 3.0.0b1",
    )

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        reasons = probe_reasons(self.probe, problem.device)
        flag = os.environ.get(VERSION_FLAG)
        if flag is not None and flag.strip() != "3":
            reasons.append(f"{VERSION_FLAG}={flag} selects a FlashMask path other than V3")
        return reasons

    @override
    def not_supported_reasons(
        self, problem: Problem, mask: AttnMask | None = None, pass_: str = "fwd"
    ) -> list[str]:
        reasons = super().not_supported_reasons(problem, mask, pass_)
        if mask is not None and mask.num_heads in (1, problem.heads_kv):
            reasons.extend(mask_reasons(mask))
        return reasons

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.probe.module)  # lazily: CUDA-only package
        os.environ.setdefault(VERSION_FLAG, "3")  # the module does int(os.getenv(...))
        return _PreparedFlashMask(mask, problem, module.flashmask_attention)
