"""GPU-only kernels, registered with their capabilities so every cell gets a precise status.

cuDNN fused attention (TransformerEngine) needs CUDA and a package that does not exist for
CPU. Its mask lowering (varlen) is written
and tested in `lcab.masks.lowering`; the calls into the packages are a later step, so
``adapter_ready=False``: on a machine that has CUDA and the package, the cell is skipped with
"adapter not written yet" rather than run by an untested adapter. On any other machine the
reasons name the missing CUDA device and package. (FlashAttention 2/3, MagiAttention FFA and
FlashMask have adapters: `lcab.kernels.flash_attn`, `lcab.kernels.magi_ffa`,
`lcab.kernels.flashmask`.)
"""

from __future__ import annotations

from typing import Any

import torch

from lcab.kernels.base import Kernel, KernelCaps, PreparedAttention, Problem
from lcab.kernels.registry import register_kernel
from lcab.masks.core import AttnMask

_HALF = frozenset({torch.float16, torch.bfloat16})
_CUDA = frozenset({"cuda"})


def _cuda_caps(
    *, lowering: str, package: str, pip_name: str, sm: tuple[int, int], **more: Any
) -> KernelCaps:
    """What every one of these kernels shares: CUDA fwd + bwd in half precision, no adapter yet."""
    fields: dict[str, Any] = {"max_head_dim": 256} | more
    return KernelCaps(
        devices=_CUDA,
        dtypes=_HALF,
        lowering=lowering,
        backward_devices=_CUDA,
        package=package,
        pip_name=pip_name,
        min_compute_capability=sm,
        adapter_ready=False,
        **fields,
    )


class _GpuOnlyKernel(Kernel):
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        raise NotImplementedError(
            f"lcab's {self.name} adapter is not written yet; not_supported_reasons() says so"
        )


@register_kernel
class CudnnKernel(_GpuOnlyKernel):
    """cuDNN fused attention through TransformerEngine (thd layout, padding masks)."""

    name = "cudnn"
    summary = "cuDNN fused attention via TransformerEngine, varlen + window"
    caps = _cuda_caps(
        lowering="varlen",
        package="transformer_engine",
        pip_name="transformer-engine[pytorch]",
        sm=(8, 0),
    )
