"""``torch_varlen``: PyTorch's own varlen attention, the FA2-class baseline that needs no install.

``torch.nn.attention.varlen.varlen_attn`` (CUDA only) with the fa2 varlen lowering; call and
LSE layout ((H_q, T_q), not its docstring's (T_q, H_q)) are rows of
`lcab.kernels.upstream.torch_attention`. torch does not say how causal or windowed sequences
with unequal query/key counts align, so those are refused. The backward from merged statistics
calls ``torch_attn::_varlen_attn_backward`` with the merged out and LSE. CPU contract-tested
(meta tensors and a plain-torch stand-in), never a GPU run.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import override

from lcab.kernels.base import (
    Grads,
    Kernel,
    Output,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
)
from lcab.kernels.library_results import LibraryCall, cu_seqlens, lse_reading
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream.torch_attention import VARLEN_ATTN, VARLEN_BACKWARD_OP
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering import lowering_reason, to_varlen

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

MODULE = VARLEN_ATTN.module
#: Keywords lcab passes to ``varlen_attn`` (after the seven positional arguments).
CALL_KWARGS = ("return_aux", "scale", "window_size", "enable_gqa")
LSE_FACTOR, LSE_LAYOUT = lse_reading(VARLEN_ATTN)


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
    unequal = (sq != sk) & (sq > 0) & (sk > 0)  # no key (or no query): nothing to align
    if aligned and unequal.any():
        b = int(np.flatnonzero(unequal)[0])
        return [
            f"sequence {b} has {int(sq[b])} queries and {int(sk[b])} keys; torch's varlen_attn "
            "does not document causal/window alignment for unequal lengths"
        ]
    return []


class _PreparedTorchVarlen(LibraryCall):
    """The call's tensors and keywords, fixed in `prepare`, and the rows attending nothing."""

    library = "varlen_attn"
    follows = f"{VARLEN_ATTN.source} ({LSE_LAYOUT})"

    def __init__(self, mask: AttnMask, problem: Problem, varlen: Any) -> None:
        args = to_varlen(mask)
        left, right = (int(w) for w in args.window_size)
        device = problem.device
        self.fn = getattr(varlen, VARLEN_ATTN.name)
        self.backward_op = getattr(varlen, VARLEN_BACKWARD_OP.name, None)  # the custom op
        self.expect(mask, problem)
        self.positional = (
            cu_seqlens(args.cu_seqlens_q, device),
            cu_seqlens(args.cu_seqlens_k, device),
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

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        out, lse = self.fn(q, k, v, *self.positional, **self.kwargs)
        return self.convention(out, lse * LSE_FACTOR, LSE_LAYOUT, q.dtype)

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """(dq, dk, dv) under the merged (out, lse), as torch's ``_backward`` calls its op."""
        if self.backward_op is None:
            raise NotImplementedError(
                f"torch {torch.__version__}'s {MODULE} has no {VARLEN_BACKWARD_OP.name}"
            )
        window = list(self.kwargs["window_size"])
        rng_state = torch.zeros(2, dtype=torch.uint64, device=q.device)
        dq, dk, dv = self.backward_op(
            dout.contiguous(),
            q,
            k,
            v,
            out.contiguous(),
            lse.contiguous(),  # lcab's (Hq, Sq) is the op's (H_q, T_q)
            *self.positional,
            tuple(window) == (-1, 0),
            rng_state,
            self.kwargs["scale"],
            window,
        )
        return dq, dk, dv


@register_kernel
class TorchVarlenKernel(Kernel):
    """torch.nn.attention.varlen: torch's built-in FA2 on packed sequences (CPU contract-tested)."""

    name = "torch_varlen"
    colour = "#3182bd"
    gpu_compared = True
    summary = "torch.nn.attention.varlen (torch's FA2, no install), documents + windows"
    caps = cuda_adapter_caps(
        "varlen",
        max_head_dim=256,
        min_compute_capability=(8, 0),
        stats_backward=True,
    )

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        return api_reasons()

    @override
    def mask_reasons(self, mask: AttnMask) -> list[str]:
        return super().mask_reasons(mask) + mask_reasons(mask)

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return _PreparedTorchVarlen(mask, problem, __import__(MODULE, fromlist=["varlen_attn"]))
