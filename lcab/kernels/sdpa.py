"""PyTorch scaled_dot_product_attention: ``sdpa`` and its backend-pinned variants.

``is_causal`` for exactly full or causal masks, else a dense additive mask (as in the paper). On
CPU the flash-attention op ``F.sdpa`` dispatches to is called directly, so the LSE comes back.
The unpinned ``sdpa`` on CUDA pins the backend ``torch._fused_sdp_choice`` picks on the call's
real tensors, once per grad mode, and names it (``backend_used``): on fake tensors it answered
MATH where cuDNN ran (H100, torch 2.11; notebooks/data/gpu_h100_sdpa_choice.jsonl), 60x slower.
SDPA leaves rows with no key undocumented (NaN in its reference), so they get a finite bias and
lcab sets them to out 0 / LSE -inf afterwards, on every path.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from lcab.kernels.base import (
    Grads,
    Kernel,
    Output,
    PreparedAttention,
    Problem,
    empty_rows,
    lse_dtype,
    torch_caps,
)
from lcab.kernels.registry import register_kernel
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.geometry import SliceKind

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())
    F = lazy_module("torch.nn.functional", globals(), "F")


def whole_mask_kind(mask: AttnMask) -> str | None:
    """'full' or 'causal' when the mask is one such slice over a square, else None."""
    if mask.num_heads != 1 or mask.num_slices != 1 or mask.seqlen_q != mask.seqlen_k:
        return None
    q0, q1, k0, k1, kind = mask.slices[0].tolist()
    if (q0, q1, k0, k1) != (0, mask.seqlen_q, 0, mask.seqlen_k):
        return None
    return {SliceKind.FULL: "full", SliceKind.CAUSAL: "causal"}.get(SliceKind(kind))


def calls_cpu_flash_op(backend: str | None, device: torch.device) -> bool:
    """Whether the kernel calls the CPU flash-attention op directly (a seam for tests)."""
    return backend is None and device.type == "cpu"


def sdpa_kernel(backend: torch.nn.attention.SDPBackend) -> Any:
    """Torch's ``sdpa_kernel`` pin of one backend (a seam: tests record the pins through it)."""
    return torch.nn.attention.sdpa_kernel(backend)


class _PreparedSDPA(PreparedAttention):
    layout = "bhsd"

    def __init__(self, mask: AttnMask, problem: Problem, backend: str | None) -> None:
        self.backend = backend
        self.scale = 1.0 / math.sqrt(problem.head_dim)
        self.group = problem.gqa_group
        whole = whole_mask_kind(mask)
        self.is_causal = whole == "causal"
        self.bias: torch.Tensor | None = None
        if whole is None:
            dense = mask.to_dense(max_elements=1 << 40).to(problem.device)
            dense = dense | ~dense.any(-1, keepdim=True)  # empty rows: a finite bias, out 0 later
            if dense.dim() == 3:
                dense = dense.repeat_interleave(problem.heads_q // mask.num_heads, dim=0)
            bias = torch.zeros(dense.shape, dtype=problem.torch_dtype, device=problem.device)
            self.bias = bias.masked_fill_(~dense, float("-inf"))
            if self.bias.dim() == 2:
                self.bias = self.bias.reshape(1, 1, *self.bias.shape)
            else:
                self.bias = self.bias.unsqueeze(0)
        rows = empty_rows(mask).repeat_interleave(problem.heads_q // mask.num_heads, 0)
        self.has_empty = bool(rows.any())  # on the host
        self.empty = rows.to(problem.device)
        """(Hq, Sq): rows attending no key, whose out lcab sets to 0 (and lse to -inf)."""
        self.cpu_lse = calls_cpu_flash_op(backend, problem.torch_device)
        self.backend_used: str | None = "FLASH_ATTENTION" if self.cpu_lse else backend
        """The SDPA backend of the latest call (for the default kernel: PyTorch's choice)."""
        self.choices: dict[bool, str] = {}
        """Default kernel: PyTorch's choice without / with a backward (key: requires grad)."""
        self.backend_resolved_at: str | None = None
        """Where the default kernel's backend was chosen ("first call"; None before one)."""

    def _default_backend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
    ) -> str:
        """The backend F.sdpa would dispatch these arguments to, by name (e.g. CUDNN_ATTENTION)."""
        choice = torch._fused_sdp_choice(
            q, k, v, bias, 0.0, self.is_causal, scale=self.scale, enable_gqa=self.group > 1
        )
        return torch.nn.attention.SDPBackend(choice).name

    def _pin_default(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """The default kernel's backend for this call's grad mode (chosen now if still open)."""
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if grad not in self.choices:
            self.choices[grad] = self._default_backend(q, k, v, self.bias)
            self.backend_resolved_at = "first call"
        return self.choices[grad]

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        if self.cpu_lse:
            if self.bias is not None and self.bias.shape[1] > 1 and self.group > 1:
                k = k.repeat_interleave(self.group, dim=1)  # per-head bias needs matching heads
                v = v.repeat_interleave(self.group, dim=1)
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, self.is_causal, attn_mask=self.bias, scale=self.scale
            )
            lse = lse[0].to(lse_dtype(q.dtype))
            if self.has_empty:  # lcab's convention, whatever the op gave (its lse: 0)
                lse = lse.masked_fill(self.empty, float("-inf"))
            return self._zero_empty(out), lse
        name = self.backend or self._pin_default(q, k, v)
        self.backend_used = name
        with sdpa_kernel(getattr(torch.nn.attention.SDPBackend, name)):
            bias, gqa = self.bias, self.group > 1
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, is_causal=self.is_causal, scale=self.scale, enable_gqa=gqa
            )
            return self._zero_empty(out), None

    def _zero_empty(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (1, Hq, Sq, D) with lcab's 0 on the rows that attend no key."""
        return out.masked_fill(self.empty[None, :, :, None], 0.0) if self.has_empty else out

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """The CPU flash-attention backward, fed the merged (out, lse) of the whole rows."""
        if not self.cpu_lse:
            return super().backward(dout, q, k, v, out, lse)
        group = self.group if self.bias is not None and self.bias.shape[1] > 1 else 1
        kk = k.repeat_interleave(group, dim=1) if group > 1 else k
        vv = v.repeat_interleave(group, dim=1) if group > 1 else v
        # +inf makes probabilities exp(s - inf) = 0, not NaN, on rows with no key anywhere and
        # on rows with no key in this block (their bias is finite: see the module's docstring)
        no_key = torch.isneginf(lse) | self.empty if self.has_empty else torch.isneginf(lse)
        # the op reads its statistics in the accumulation type (float32 for bf16/fp16 inputs)
        stats = lse.masked_fill(no_key, float("inf")).to(lse_dtype(q.dtype)).unsqueeze(0)
        args = (dout.contiguous(), q, kk, vv, out.contiguous(), stats, 0.0, self.is_causal)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *args, attn_mask=self.bias, scale=self.scale
        )
        if group > 1:
            dk = dk.unflatten(1, (-1, group)).sum(2)
            dv = dv.unflatten(1, (-1, group)).sum(2)
        return dq, dk, dv


@register_kernel
class SDPAKernel(Kernel):
    """torch SDPA, default backend choice; returns the LSE on CPU."""

    name = "sdpa"
    colour = "#bcbd22"
    summary = "torch.nn.functional.scaled_dot_product_attention (is_causal or dense mask)"
    caps = torch_caps("dense")
    backend: ClassVar[str | None] = None

    def returns_lse(self, device_type: str) -> bool:
        """The LSE comes back on CPU only (the CUDA path calls the public F.sdpa)."""
        return self.backend is None and device_type == "cpu"

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return _PreparedSDPA(mask, problem, self.backend)


class _MaskFreeSDPA(SDPAKernel):
    """A pinned backend that takes no ``attn_mask`` (flash): only ``is_causal`` or nothing."""

    rectangle_closed = False  # a rectangle of a causal mask is no longer is_causal

    def not_supported_reasons(
        self, problem: Problem, mask: AttnMask | None = None, pass_: str = "fwd"
    ) -> list[str]:
        reasons = super().not_supported_reasons(problem, mask, pass_)
        if mask is not None and whole_mask_kind(mask) is None:
            reasons.append(
                f"SDPA's {self.backend} backend takes no attn_mask: only the full or causal "
                f"mask (is_causal) over the whole sequence, not {mask.name!r}"
            )
        return reasons


def _pinned(
    kernel_name: str,
    backend_name: str,
    devices: frozenset[str],
    doc: str,
    colour: str,
    base: type[SDPAKernel] = SDPAKernel,
    gqa: bool = True,
    gpu_compared: bool = False,
) -> type[Kernel]:
    cls = type(
        f"SDPA{backend_name.title().replace('_', '')}Kernel",
        (base,),
        {
            "name": kernel_name,
            "backend": backend_name,
            "summary": doc,
            "__doc__": doc,
            "colour": colour,
            "gpu_compared": gpu_compared,
            "caps": torch_caps(
                "dense",
                devices=devices,
                backward_devices=devices,
                returns_lse=False,
                gqa=gqa,
                stats_backward=False,
            ),
        },
    )
    return register_kernel(cls)


_pinned(
    "sdpa_flash",
    "FLASH_ATTENTION",
    frozenset({"cuda"}),
    "SDPA pinned to its flash backend (full or causal only)",
    "#17becf",
    _MaskFreeSDPA,
)
# No GQA: on an H200 (torch 2.11) the memory-efficient backend refused every enable_gqa call.
_pinned(
    "sdpa_efficient",
    "EFFICIENT_ATTENTION",
    frozenset({"cuda"}),
    "SDPA pinned to its memory-efficient backend (no GQA)",
    "#393b79",
    gqa=False,
)
_pinned(
    "sdpa_cudnn",
    "CUDNN_ATTENTION",
    frozenset({"cuda"}),
    "SDPA pinned to cuDNN fused attention (no TransformerEngine)",
    "#637939",
    gpu_compared=True,
)
_pinned(
    "sdpa_math", "MATH", frozenset({"cpu", "cuda"}), "SDPA pinned to its math backend", "#8c6d31"
)
