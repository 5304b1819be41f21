"""``torch_varlen``: PyTorch's own varlen attention, the FA2-class baseline that needs no install.

``torch.nn.attention.varlen.varlen_attn`` runs torch's built-in FlashAttention 2 kernels
(``aten::_flash_attention_forward``; CUDA only) on packed sequences: documents through
``cu_seq_q``/``cu_seq_k``, causal and sliding windows through ``window_size`` — (-1, 0) is
causal, (W, 0) causal with a window — GQA through ``enable_gqa``, the LSE as (T_q, H_q) in
natural log through ``return_aux=AuxRequest(lse=True)``. On a GPU machine with nothing but torch
this is the cell that tells whether a separately built flash-attn is worth its build.

It takes the same varlen lowering as ``fa2`` (one call, a single sequence being N = 1). torch
does not document how a causal or windowed sequence aligns when its query and key counts
differ, so such masks (CP rectangles of causal masks) are refused rather than guessed; rows that
attend nothing get lcab's convention (out 0, LSE -inf) from the mask. **CPU contract-tested
only**: the tests replace ``varlen_attn`` by a plain-torch stand-in of its documented contract.
"""

from __future__ import annotations

import inspect
from typing import Any

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
from lcab.kernels.registry import register_kernel
from lcab.masks.core import AttnMask
from lcab.masks.lowering import lowering_reason, to_varlen

MODULE = "torch.nn.attention.varlen"
#: Keywords lcab passes to ``varlen_attn`` (after the seven positional arguments).
CALL_KWARGS = ("return_aux", "scale", "window_size", "enable_gqa")


def api_reasons() -> list[str]:
    """Why this torch's ``varlen_attn`` is not the one lcab calls (empty: it is)."""
    try:
        varlen = __import__(MODULE, fromlist=["varlen_attn", "AuxRequest"])
    except ImportError:
        return [f"torch {torch.__version__} has no {MODULE} (it appeared in torch 2.10)"]
    fn = getattr(varlen, "varlen_attn", None)
    if fn is None or not hasattr(varlen, "AuxRequest"):
        return [f"torch {torch.__version__}'s {MODULE} lacks varlen_attn or AuxRequest"]
    params = inspect.signature(fn).parameters
    missing = [k for k in CALL_KWARGS if k not in params]
    return (
        [f"torch {torch.__version__}'s varlen_attn has no {', '.join(missing)}"] if missing else []
    )


def mask_reasons(mask: AttnMask) -> list[str]:
    """Masks the varlen lowering expresses but whose alignment torch does not document."""
    if mask.num_heads != 1 or lowering_reason(mask, "varlen") is not None:
        return []  # the base class reports these
    args = to_varlen(mask)
    sq, sk = np.diff(args.cu_seqlens_q), np.diff(args.cu_seqlens_k)
    aligned = args.causal or tuple(int(w) for w in args.window_size) != (-1, -1)
    if aligned and (sq != sk).any():
        b = int(np.flatnonzero(sq != sk)[0])
        return [
            f"sequence {b} has {int(sq[b])} queries and {int(sk[b])} keys; torch's varlen_attn "
            "does not document causal/window alignment for unequal lengths"
        ]
    return []


class _PreparedTorchVarlen(PreparedAttention):
    """The call's tensors and keywords, fixed in `prepare`, and the rows attending nothing."""

    layout = "shd"

    def __init__(self, mask: AttnMask, problem: Problem, varlen: Any) -> None:
        args = to_varlen(mask)
        left, right = (int(w) for w in args.window_size)
        device = problem.device
        self.fn = varlen.varlen_attn
        self.heads, self.seqlen = problem.heads_q, problem.seqlen_q
        self.positional = (
            torch.as_tensor(args.cu_seqlens_q, dtype=torch.int32).to(device).contiguous(),
            torch.as_tensor(args.cu_seqlens_k, dtype=torch.int32).to(device).contiguous(),
            int(args.max_seqlen_q),
            int(args.max_seqlen_k),
        )
        self.kwargs: dict[str, Any] = {
            "return_aux": varlen.AuxRequest(lse=True),
            "scale": problem.head_dim**-0.5,
            # causal is a window whose right side is 0 ((-1, 0): plain causal)
            "window_size": (left, 0) if args.causal else (left, right),
            "enable_gqa": problem.heads_q != problem.heads_kv,
        }
        self.empty = empty_rows(mask)[0].to(device)
        self.has_empty = bool(self.empty.any())

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, lse = self.fn(q, k, v, *self.positional, **self.kwargs)
        return to_lcab_convention(
            out,
            lse,
            "th",
            heads=self.heads,
            seqlen=self.seqlen,
            empty=self.empty if self.has_empty else None,
            dtype=q.dtype,
            library="varlen_attn",
            follows="torch 2.11-2.13",
        )


@register_kernel
class TorchVarlenKernel(Kernel):
    """torch.nn.attention.varlen: torch's built-in FA2 on packed sequences (CPU contract-tested)."""

    name = "torch_varlen"
    summary = "torch.nn.attention.varlen (torch's FA2, no install), documents + windows"
    caps = cuda_adapter_caps(
        "varlen",
        max_head_dim=256,
        min_compute_capability=(8, 0),
    )

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        return api_reasons()

    @override
    def not_supported_reasons(
        self, problem: Problem, mask: AttnMask | None = None, pass_: str = "fwd"
    ) -> list[str]:
        reasons = super().not_supported_reasons(problem, mask, pass_)
        return reasons + (mask_reasons(mask) if mask is not None else [])

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return _PreparedTorchVarlen(mask, problem, __import__(MODULE, fromlist=["varlen_attn"]))
