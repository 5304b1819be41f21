"""FlashAttention 2 (``flash_attn``) and 3 (``flash_attn_interface``) adapters, varlen lowering.

CPU contract-tested only (FA2 through its own Python over an emulated extension, FA3 against
stand-ins). One sequence → the dense ``flash_attn_func`` on (1, S, H, D) views; several →
``flash_attn_varlen_func`` with int32 cu_seqlens. Calls, LSE layouts and window rules are the
rows of `lcab.kernels.upstream.flash_attn`; the libraries' edges are in the kernels guide.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from typing_extensions import override

from lcab.kernels import flash_backward
from lcab.kernels.base import (
    Grads,
    Kernel,
    KernelCaps,
    Output,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
)
from lcab.kernels.fa2_window import fa2_spelling, fa2_window_reason
from lcab.kernels.library_results import LibraryCall, LseLayout, cu_seqlens
from lcab.kernels.packages import ApiNeed, PackageProbe, cuda_present, imported_or_none
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream import flash_attn as fa_table
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering import VarlenArgs, to_varlen

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

#: A library's backward from merged statistics: (prepared, dout, q, k, v, out, lse) → grads.
StatsBackward: TypeAlias = "Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]"

#: Keywords the adapter passes to both calls (FA2 and FA3 spell them the same).
CALL_KWARGS = ("softmax_scale", "causal", "window_size", "return_attn_probs")
#: Extra keywords of the varlen call.
VARLEN_KWARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


class PreparedFlash(LibraryCall):
    """The lowered call of every FlashAttention generation (FA2, FA3, FA4).

    They differ only in how a call asks for the LSE (`lse_kwargs`) and spells a window.
    """

    #: Keyword arguments that make the library return its LSE.
    lse_kwargs: ClassVar[dict[str, Any]] = {"return_attn_probs": True}
    library = "FlashAttention"
    follows = "flash-attn 2.8 / FA3 hopper"

    def __init__(
        self,
        mask: AttnMask,
        problem: Problem,
        dense_fn: Callable[..., Any],
        varlen_fn: Callable[..., Any],
        stats_backward: StatsBackward | None = None,
    ) -> None:
        args = to_varlen(mask)
        self.expect(mask, problem)
        self.stats_backward = stats_backward
        left, right = self.unswapped(args, problem)
        self.kwargs: dict[str, Any] = {
            "softmax_scale": problem.head_dim**-0.5,
            "causal": bool(args.causal),
            "window_size": self.window(int(left), int(right)),
            **self.lse_kwargs,
        }
        self.varlen = not args.is_single_sequence
        self.fn = varlen_fn if self.varlen else dense_fn
        if self.varlen:
            self.kwargs.update(
                cu_seqlens_q=cu_seqlens(args.cu_seqlens_q, problem.device),
                cu_seqlens_k=cu_seqlens(args.cu_seqlens_k, problem.device),
                max_seqlen_q=int(args.max_seqlen_q),
                max_seqlen_k=int(args.max_seqlen_k),
            )
        self.returned_lse_dtype: torch.dtype | None = None

    @staticmethod
    def window(left: int, right: int) -> tuple[int | None, int | None]:
        """The library's ``window_size`` for the lowering's (left, right), -1 = unbounded."""
        return left, right

    def unswapped(self, args: VarlenArgs, problem: Problem) -> tuple[int, int]:
        """The lowering's window, as the library must be given it (FA2 overrides)."""
        return args.window_size

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """Gradients under merged (out, lse): FA4 by autograd, FA2/FA3 their private backward."""
        if self.lse_grad:
            return super().backward(dout, q, k, v, out, lse)
        if self.stats_backward is None:
            raise NotImplementedError(f"{self.library}: no backward from merged statistics")
        return self.stats_backward(self, dout, q, k, v, out, lse)

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        """One library call on packed tensors; (out, lse) in lcab's convention."""
        layout: LseLayout
        if self.varlen:
            result = self.fn(q, k, v, **self.kwargs)
            out, layout = result[0], "ht"
        else:
            result = self.fn(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), **self.kwargs)
            out, layout = result[0].squeeze(0), "bhs"
        self.returned_lse_dtype = result[1].dtype  # what its backward is given back
        # libraries disagree on empty rows (FA2 +inf, FA3/FA4 -inf): lcab's is out 0, lse -inf
        return self.convention(out, result[1], layout, q.dtype)


class PreparedFA2(PreparedFlash):
    """FA2's call: the lowering's window spelled so that FA2 applies it exactly."""

    library = "FlashAttention 2"
    follows = "flash-attn 2.8.3"

    @override
    def unswapped(self, args: VarlenArgs, problem: Problem) -> tuple[int, int]:
        """`fa2_spelling` of the lowering's window (`fa2_window_reason` refuses the rest first)."""
        spelled = fa2_spelling(args, problem.seqlen_q, problem.heads_q > problem.heads_kv)
        if spelled is None:
            raise ValueError(f"FA2 cannot apply window_size {args.window_size} exactly")
        return spelled


def _fa_caps(package: PackageProbe, sm: tuple[int, int]) -> KernelCaps:
    return cuda_adapter_caps(
        "varlen", max_head_dim=256, requires=package, min_compute_capability=sm, stats_backward=True
    )


def _needs(*extra: str) -> tuple[ApiNeed, ...]:
    return (
        ApiNeed("flash_attn_func", (*CALL_KWARGS, *extra), positional=3),
        ApiNeed("flash_attn_varlen_func", (*VARLEN_KWARGS, *CALL_KWARGS, *extra), positional=3),
    )


class _FlashAttnKernel(Kernel):
    """Shared by FA2 and FA3: same keywords, same lowering, same LSE layouts."""

    prepared_cls: ClassVar[type[PreparedFlash]] = PreparedFlash
    gpu_compared = True

    def library_backward(self) -> StatsBackward | None:
        return None

    def library_backward_reasons(self) -> list[str]:
        return []

    @override
    def stats_backward_reasons(self, problem: Problem) -> list[str]:
        reasons = super().stats_backward_reasons(problem)
        would_run = problem.device_type == "cuda" and cuda_present()
        if reasons or not would_run or self.environment_reasons(problem.device):
            return reasons
        return self.library_backward_reasons()

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        calls = (module.flash_attn_func, module.flash_attn_varlen_func)
        prepared = self.prepared_cls(mask, problem, *calls, self.library_backward())
        prepared.kwargs.update(self.options)  # the kernel's options are call keywords
        return prepared


@register_kernel
class FA2Kernel(_FlashAttnKernel):
    """FlashAttention 2 (``flash_attn`` >= 2.8), dense or varlen call (CPU contract-tested)."""

    name = "fa2"
    summary = "FlashAttention 2 (flash_attn), varlen + window"
    colour = "#1f77b4"
    caps = _fa_caps(
        PackageProbe(
            module="flash_attn",
            distributions=("flash-attn", "flash_attn"),
            install="bash launchers/wheelhouse.sh build fa2",
            note="the PyPI sdist, 24 min on 2 cores (keep the wheel); or FLASH_ATTN_CUDA_ARCHS=90 "
            'pip install --no-build-isolation "lcab[fa2]"',
            needs=_needs(),
            min_version="2.8",
            requirement=">= 2.8",
        ),
        (8, 0),
    )
    prepared_cls = PreparedFA2
    rows = (fa_table.FA2_BACKWARD, fa_table.FA2_VARLEN_BACKWARD)

    @override
    def mask_reasons(self, mask: AttnMask) -> list[str]:
        reasons = super().mask_reasons(mask)
        why = None if reasons else fa2_window_reason(mask)
        return reasons + ([why] if why else [])

    @override
    def library_backward(self) -> StatsBackward | None:
        module = imported_or_none(fa_table.FA2_BACKWARD.module)
        if module is None or self.library_backward_reasons():
            return None
        functions = {row.name: getattr(module, row.name) for row in self.rows}

        def call(prepared: PreparedFlash, *tensors: torch.Tensor) -> flash_backward.Grads:
            args = (functions, prepared.kwargs, prepared.varlen)
            return flash_backward.fa2_backward(
                *args, *tensors, returned=prepared.returned_lse_dtype
            )

        return call

    @override
    def library_backward_reasons(self) -> list[str]:
        module = imported_or_none(fa_table.FA2_BACKWARD.module)
        if module is None:
            return [f"{fa_table.FA2_BACKWARD.module} does not import"]
        found = (flash_backward.mismatch(getattr(module, r.name, None), r) for r in self.rows)
        return [why for why in found if why is not None]


@dataclass
class FA3Options:
    """Options of the ``fa3`` kernel (its Hydra config fields), passed to every FA3 call."""

    sm_margin: int = 0
    """SMs FA3's persistent kernels leave free for NCCL under CP (raise it when a trace shows the
    ring's transfers waiting behind attention)."""


@register_kernel
class FA3Kernel(_FlashAttnKernel):
    """FlashAttention 3 (hopper build, ``flash_attn_interface``), dense or varlen (CPU-tested)."""

    name = "fa3"
    options_cls = FA3Options
    summary = "FlashAttention 3 (flash_attn_interface, Hopper), varlen + window"
    colour = "#ff7f0e"
    caps = _fa_caps(
        PackageProbe(
            module="flash_attn_interface",
            distributions=("flash_attn_3", "flash-attn-3"),
            install="bash launchers/wheelhouse.sh build fa3",
            note="then `pip install --no-deps` the wheel: flash-attention's hopper/ build, made "
            "[here](#building-the-papers-kernels-here-for-the-gpu-image) for torch 2.11.0+cu130, "
            "sm_90a (5.6 min on 2 cores); elsewhere the same script with that machine's torch "
            "pinned in it",
            needs=_needs("sm_margin"),
            min_version="3.0",
            requirement="a hopper build from 2025-08-29 (203b9b3d) or later, whose calls take "
            "return_attn_probs",
        ),
        (9, 0),
    )

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        reasons = []
        if problem.head_dim % 8:  # hopper flash_api.cpp L854-855: checked, never padded
            reasons.append(f"FA3 takes head dims in multiples of 8, not {problem.head_dim}")
        if problem.device_type == "cuda" and cuda_present():
            major, minor = torch.cuda.get_device_capability(problem.device)
            if major != 9:  # sm_90a code runs on Hopper only, not on later architectures
                reasons.append(
                    f"FA3's hopper build has sm_90a kernels only (this GPU is sm_{major}{minor})"
                )
        return reasons

    @override
    def library_backward(self) -> StatsBackward | None:
        fn = getattr(imported_or_none(self.module), fa_table.FA3_BACKWARD.name, None)
        row = flash_backward.fa3_generation(fn) if fn is not None else None
        if fn is None or row is None:
            return None

        def call(prepared: PreparedFlash, *tensors: torch.Tensor) -> flash_backward.Grads:
            assert fn is not None and row is not None
            dtype = prepared.returned_lse_dtype
            args = (fn, row, prepared.kwargs, prepared.varlen)
            return flash_backward.fa3_backward(*args, *tensors, returned=dtype)

        return call

    @override
    def library_backward_reasons(self) -> list[str]:
        module = imported_or_none(self.module)
        fn = getattr(module, fa_table.FA3_BACKWARD.name, None)
        if fn is not None and flash_backward.fa3_generation(fn) is not None:
            return []
        rows = (fa_table.FA3_BACKWARD, fa_table.FA3_BACKWARD_AUG_2025)
        known = "; ".join(f"{row.source.split(':')[0]}: {', '.join(row.params)}" for row in rows)
        if module is None:
            return [f"{self.module} does not import"]
        kind = flash_backward.callable_kind(fn)
        found = "none" if fn is None else ", ".join(flash_backward.parameters(fn))
        return [
            f"flash_attn_interface._flash_attn_backward ({kind}) has parameters ({found}), "
            f"neither generation lcab calls ({known})"
        ]
