"""cuDNN fused attention through TransformerEngine's ``DotProductAttention`` (thd layout).

CPU contract-tested only; constructor and ``forward`` are rows of `lcab.kernels.upstream.cudnn`.
Varlen lowering as for fa2; `prepare` sets ``NVTE_FUSED_ATTN=1``, ``NVTE_FLASH_ATTN=0``,
``NVTE_UNFUSED_ATTN=0`` so a call cuDNN cannot take fails instead of timing another backend
under the name "cudnn". Refused rather than guessed (`mask_reasons`): causal or windowed
sequences with unequal query/key lengths (TE's alignment differs from the lowering's), empty
sequences, and windows with one unbounded side other than (-1, 0). TE returns no LSE.
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
from lcab.kernels.library_results import cu_seqlens
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
        self.kwargs: dict[str, Any] = {
            "qkv_format": "thd",
            "cu_seqlens_q": cu_seqlens(args.cu_seqlens_q, device),
            "cu_seqlens_kv": cu_seqlens(args.cu_seqlens_k, device),
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
    def mask_reasons(self, mask: AttnMask) -> list[str]:
        return super().mask_reasons(mask) + mask_reasons(mask)

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        os.environ.update(BACKEND_ENV)  # cuDNN or an error, never another backend
        return _PreparedTE(mask, problem, module)
