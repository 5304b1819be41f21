"""MagiAttention Flex-Flash-Attention (``magi_attention.functional.flex_flash_attn_func``) adapter.

CPU contract-tested only; every function and fact is a row of `lcab.kernels.upstream.magi_ffa`
(v1.1.1). FFA takes lcab's slices as they are (``q_ranges``/``k_ranges``/``attn_type_map``,
moved to the device in `prepare`), by keyword: the probe refuses pre-v1.1 signatures, which
returned ``(out, lse)``. ``max_seqlen_q`` stays None, its meaning being undocumented. The backward
from merged statistics is ``_flex_flash_attn_backward`` (`lcab.kernels.flash_backward`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lcab.kernels.base import (
    Grads,
    Kernel,
    Output,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
    lse_dtype,
)
from lcab.kernels.flash_backward import ffa_backward, mismatch, takes
from lcab.kernels.library_results import LibraryCall
from lcab.kernels.packages import ApiNeed, PackageProbe, cuda_present, imported_or_none
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream.magi_ffa import FFA_BACKWARD
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering import to_ffa

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

#: Keywords the adapter passes to ``flex_flash_attn_func`` (after q, k, v by position).
FFA_KWARGS = ("q_ranges", "k_ranges", "attn_type_map", "softmax_scale", "sm_margin")
FOLLOWS = "MagiAttention v1.1 (flex_flash_attn_func returning (out, meta))"


def lse_of(result: Any) -> torch.Tensor:
    """The LSE of a ``flex_flash_attn_func`` result ``(out, meta)``: ``meta.lse``."""
    lse = getattr(result[1], "lse", None)
    if not isinstance(lse, torch.Tensor):
        raise RuntimeError(
            f"flex_flash_attn_func returned {type(result[1]).__name__} as its second item, "
            f"without an lse tensor (lcab's adapter follows {FOLLOWS})"
        )
    return lse


class _PreparedFFA(LibraryCall):
    """The slices as device tensors, the call's keywords, and the empty rows."""

    library = "FFA"
    follows = FOLLOWS

    def __init__(
        self,
        mask: AttnMask,
        problem: Problem,
        fn: Callable[..., Any],
        backward_fn: Callable[..., Any] | None = None,
    ) -> None:
        args = to_ffa(mask)
        device = problem.device
        self.fn = fn
        self.backward_fn = backward_fn
        self.expect(mask, problem)
        self.kwargs: dict[str, Any] = {
            "q_ranges": torch.from_numpy(args.q_ranges).to(device).contiguous(),
            "k_ranges": torch.from_numpy(args.k_ranges).to(device).contiguous(),
            "attn_type_map": torch.from_numpy(args.attn_type_map).to(device).contiguous(),
            "softmax_scale": problem.head_dim**-0.5,
        }
        self.no_slices = args.attn_type_map.size == 0
        self.returned_lse_dtype: torch.dtype | None = None

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        if self.no_slices:  # a CP block attending nothing: no call (FFA's N = 0 is undocumented)
            lse = torch.full((self.heads, self.seqlen), float("-inf"), device=q.device)
            return q * 0, lse.to(lse_dtype(q.dtype))
        result = self.fn(q, k, v, **self.kwargs)
        self.returned_lse_dtype = lse_of(result).dtype  # what its backward is given back
        return self.convention(result[0], lse_of(result), "th", q.dtype)

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """Gradients of this block under the merged (out, lse): FFA's own backward kernel."""
        if self.no_slices:
            return q * 0, k * 0, v * 0
        if self.backward_fn is None:
            raise NotImplementedError(
                f"FFA: no {FFA_BACKWARD.name} in {FFA_BACKWARD.module}, so no backward from "
                "merged softmax statistics"
            )
        dtype = self.returned_lse_dtype
        return ffa_backward(self.backward_fn, self.kwargs, dout, q, k, v, out, lse, returned=dtype)


@dataclass
class FFAOptions:
    """Options of the ``ffa`` kernel (its Hydra config fields), passed to every FFA call."""

    sm_margin: int = 0
    """SMs FFA's kernels leave free for NCCL under CP, forward and backward (as for FA3)."""


@register_kernel
class FFAKernel(Kernel):
    """MagiAttention Flex-Flash-Attention: consumes the slices natively (CPU contract-tested)."""

    name = "ffa"
    options_cls = FFAOptions
    summary = "MagiAttention FFA (magi_attention), slices natively"
    colour = "#9467bd"
    gpu_compared = True
    caps = cuda_adapter_caps(
        "ffa",
        head_dims=frozenset({64, 128}),
        requires=PackageProbe(
            module="magi_attention.functional",
            package="magi_attention",
            distributions=("magi_attention", "magi-attention"),
            install="bash launchers/wheelhouse.sh build ffa",
            note="MagiAttention v1.1.1, 40 min on 2 cores; a cp312 extension",
            needs=(ApiNeed("flex_flash_attn_func", FFA_KWARGS, positional=3),),
            min_version="1.1",
            requirement="a source build of v1.1 or later; PyPI's magi-attention 0.0.1 is an "
            "empty placeholder",
        ),
        min_compute_capability=(9, 0),
        stats_backward=True,
    )

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        reasons = []
        if problem.device_type == "cuda" and cuda_present():
            major, minor = torch.cuda.get_device_capability(problem.device)
            if major != 9:  # native FFA asserts sm90; other GPUs need its FA4 backend (not wired)
                reasons.append(
                    f"native FFA runs on sm90 only (this GPU is sm_{major}{minor}; MagiAttention's "
                    "FA4 backend is not wired into lcab)"
                )
        return reasons

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        prepared = _PreparedFFA(mask, problem, module.flex_flash_attn_func, self._backward_fn())
        prepared.kwargs.update(self.options)  # the kernel's options are call keywords
        return prepared

    def _backward_fn(self) -> Callable[..., Any] | None:
        """The installed ``_flex_flash_attn_backward`` when its parameters are v1.1.1's."""
        fn = getattr(imported_or_none(FFA_BACKWARD.module), FFA_BACKWARD.name, None)
        return fn if takes(fn, FFA_BACKWARD) else None

    @override
    def stats_backward_reasons(self, problem: Problem) -> list[str]:
        would_run = problem.device_type == "cuda" and cuda_present()
        if not would_run or self.environment_reasons(problem.device):
            return []
        module = imported_or_none(FFA_BACKWARD.module)
        if module is None:
            return [f"{FFA_BACKWARD.module} does not import"]
        why = mismatch(getattr(module, FFA_BACKWARD.name, None), FFA_BACKWARD)
        return [why] if why else []
