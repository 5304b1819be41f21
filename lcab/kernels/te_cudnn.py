"""cuDNN fused attention through TransformerEngine's ``DotProductAttention`` (thd layout).

Written against TransformerEngine 2.x's module, whose constructor and ``forward`` are the rows
of `lcab.kernels.upstream.cudnn` (read in the 2.20.2 wheel, held to the installed file by
``tests/unit/test_upstream_packages.py``) and **CPU contract-tested only**: the tests run this
adapter's whole path against a stand-in module built from those rows, never against TE or
cuDNN. The first GPU run must confirm it, including that TE picked "FusedAttention"
(``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2``).

The mask is lowered once, in `prepare`, by `lcab.masks.lowering.to_varlen` (as for fa2): packed
(T, H, D) tensors, ``qkv_format="thd"``, int32 ``cu_seqlens_q/kv`` on the device,
``max_seqlen_q/kv`` as ints, ``attn_mask_type`` ``"padding_causal"`` or ``"padding"`` and
``window_size`` (left, right). The module is built once in `prepare` (it holds no weights).
`prepare` also sets TE's backend switches ``NVTE_FUSED_ATTN=1``, ``NVTE_FLASH_ATTN=0``,
``NVTE_UNFUSED_ATTN=0``, so a call cuDNN cannot take fails instead of silently timing
FlashAttention or TE's unfused PyTorch path under the name "cudnn".

What lcab refuses rather than guesses (`mask_reasons`):

* causal or windowed sequences whose query and key lengths differ (CP rectangles): TE's
  ``padding_causal`` is top-left aligned, the window alignment depends on the mask type and on
  a ``bottom_right_diagonal`` switch that changed across 2.x releases, while the varlen
  lowering is bottom-right aligned. With equal lengths every alignment coincides;
* empty sequences (queries with no keys or keys with no queries): undocumented in thd;
* a window with one unbounded side other than causal (-1, 0): FusedAttention takes only
  (-1, 0) or (>= 0, >= 0), so TE would run another backend.

LSE: ``DotProductAttention`` returns only ``out`` (TE's softmax statistics come out of the
private ``fused_attn_fwd`` only), so ``returns_lse=False`` and ``run`` returns ``(out, None)``;
ring-style CP cannot merge this kernel. Backward: autograd through ``out``. The output of the
thd format is (T, Hq·D) and is viewed as (T, Hq, D); any other shape is an error.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import override

from lcab.kernels.base import (
    Kernel,
    Output,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
    empty_rows,
)
from lcab.kernels.packages import ApiNeed, PackageProbe
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream import cudnn as upstream
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering import VarlenArgs, lowering_reason, to_varlen

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

#: Constructor keywords of ``DotProductAttention`` the adapter passes.
INIT_KWARGS = (
    "num_attention_heads",
    "kv_channels",
    "num_gqa_groups",
    "attention_dropout",
    "qkv_format",
    "attn_mask_type",
    "window_size",
    "softmax_scale",
)
#: Keywords of its ``forward`` (after query, key, value by position).
CALL_KWARGS = (
    "qkv_format",
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "max_seqlen_q",
    "max_seqlen_kv",
    "attn_mask_type",
    "window_size",
)
#: TE's backend switches: cuDNN (FusedAttention) only.
BACKEND_ENV = {"NVTE_FUSED_ATTN": "1", "NVTE_FLASH_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"}


def varlen_reasons(args: VarlenArgs) -> list[str]:
    """Why TE's cuDNN path cannot take ``args`` exactly (empty: it can)."""
    reasons = []
    sq, sk = np.diff(args.cu_seqlens_q), np.diff(args.cu_seqlens_k)
    left, right = (int(w) for w in args.window_size)
    if ((sq == 0) | (sk == 0)).any():
        reasons.append(
            "a sequence with no queries or no keys (TE's thd format does not document them)"
        )
    aligned = args.causal or (left, right) != (-1, -1)
    if aligned and (sq != sk).any():
        b = int(np.flatnonzero(sq != sk)[0])
        reasons.append(
            f"sequence {b} has {int(sq[b])} queries and {int(sk[b])} keys; TE's causal/window "
            "alignment for unequal lengths differs across 2.x releases, so lcab does not guess"
        )
    if not args.causal and (left < 0) != (right < 0):
        reasons.append(
            f"window_size {(left, right)}: cuDNN FusedAttention takes (-1, 0) or (>=0, >=0) only"
        )
    return reasons


def mask_reasons(mask: AttnMask) -> list[str]:
    """Reasons beyond the varlen lowering's own (which the base class reports)."""
    if mask.num_heads != 1 or lowering_reason(mask, "varlen") is not None:
        return []
    return [f"mask not taken by TE's cuDNN path: {r}" for r in varlen_reasons(to_varlen(mask))]


class _PreparedTE(PreparedAttention):
    """The module, its call keywords, and the empty rows."""

    layout = "shd"

    def __init__(self, mask: AttnMask, problem: Problem, te_pytorch: Any) -> None:
        args = to_varlen(mask)
        device = problem.device
        self.heads, self.head_dim = problem.heads_q, problem.head_dim
        left, right = (int(w) for w in args.window_size)
        mask_type = "padding_causal" if args.causal else "padding"
        window = (left, 0) if args.causal else (left, right)
        self.module = getattr(te_pytorch, upstream.DOT_PRODUCT_ATTENTION.name)(
            num_attention_heads=problem.heads_q,
            kv_channels=problem.head_dim,
            num_gqa_groups=problem.heads_kv,
            attention_dropout=0.0,
            qkv_format="thd",
            attn_mask_type=mask_type,
            window_size=window,
            softmax_scale=problem.head_dim**-0.5,
        )

        def cu(values: Any) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.int32).to(device).contiguous()

        self.kwargs: dict[str, Any] = {
            "qkv_format": "thd",
            "cu_seqlens_q": cu(args.cu_seqlens_q),
            "cu_seqlens_kv": cu(args.cu_seqlens_k),
            "max_seqlen_q": int(args.max_seqlen_q),
            "max_seqlen_kv": int(args.max_seqlen_k),
            "attn_mask_type": mask_type,
            "window_size": window,
        }
        self.empty = empty_rows(mask)[0].to(device)
        self.has_empty = bool(self.empty.any())

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        out = self.module(q, k, v, **self.kwargs)
        total = q.shape[0]
        if tuple(out.shape) not in ((total, self.heads * self.head_dim), tuple(q.shape)):
            raise RuntimeError(
                f"DotProductAttention returned {tuple(out.shape)} for thd inputs "
                f"{tuple(q.shape)}; lcab's adapter follows TE 2.x's (T, H*D)"
            )
        out = out.view(total, self.heads, self.head_dim)
        if self.has_empty:  # refused by mask_reasons; kept so lcab's convention holds anyway
            out = out.masked_fill(self.empty[:, None, None], 0.0)
        return out, None


@register_kernel
class CudnnKernel(Kernel):
    """cuDNN fused attention through TransformerEngine, thd varlen (CPU contract-tested)."""

    name = "cudnn"
    summary = "cuDNN fused attention via TransformerEngine, varlen + window"
    colour = "#7b4173"
    gpu_compared = True
    caps = cuda_adapter_caps(
        "varlen",
        max_head_dim=128,
        returns_lse=False,
        requires=PackageProbe(
            module=upstream.MODULE,
            package="transformer_engine",
            distributions=("transformer_engine", upstream.DISTRIBUTION),
            install='pip install "lcab[te]"',
            note="276 MB core wheel + an extension built from sdist",
            needs=(
                ApiNeed(upstream.DOT_PRODUCT_ATTENTION.name, INIT_KWARGS, positional=0),
                ApiNeed(upstream.DOT_PRODUCT_ATTENTION_FORWARD.name, CALL_KWARGS, positional=4),
            ),
            min_version="2.0",
            requirement=">= 2.0 (written against 2.20)",
        ),
        min_compute_capability=(8, 0),
    )

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        reasons = []
        if problem.head_dim % 8:
            reasons.append(f"head_dim {problem.head_dim} is not a multiple of 8 (cuDNN)")
        for name, value in BACKEND_ENV.items():
            if os.environ.get(name, value) != value:
                reasons.append(f"{name}={os.environ[name]} would keep TE off cuDNN")
        return reasons

    @override
    def not_supported_reasons(
        self, problem: Problem, mask: AttnMask | None = None, pass_: str = "fwd"
    ) -> list[str]:
        reasons = super().not_supported_reasons(problem, mask, pass_)
        return reasons + (mask_reasons(mask) if mask is not None else [])

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        os.environ.update(BACKEND_ENV)  # cuDNN or an error, never another backend
        return _PreparedTE(mask, problem, module)
