"""GPU-only kernels, registered with their capabilities so every cell gets a precise status.

FlashAttention 2/3, cuDNN fused attention (TransformerEngine), FlashMask and MagiAttention's FFA
need CUDA and packages that do not exist for CPU. Their mask lowerings (varlen, flashmask,
ranges) are written and tested in `lcab.masks.lowering`; the calls into the packages are a
later step, so ``adapter_ready=False``: on a machine that has CUDA and the package, the cell is
skipped with "adapter not written yet" rather than run by an untested adapter. On any other
machine the reasons name the missing CUDA device and package.
"""

from __future__ import annotations

import torch

from lcab.kernels.base import Kernel, KernelCaps, PreparedAttention, Problem
from lcab.kernels.registry import register_kernel
from lcab.masks.core import AttnMask

_HALF = frozenset({torch.float16, torch.bfloat16})
_CUDA = frozenset({"cuda"})


class _GpuOnlyKernel(Kernel):
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        raise NotImplementedError(
            f"lcab's {self.name} adapter is not written yet; not_supported_reasons() says so"
        )


@register_kernel
class FA2Kernel(_GpuOnlyKernel):
    """FlashAttention 2 (``flash_attn``), varlen API for document masks."""

    name = "fa2"
    summary = "FlashAttention 2 (flash_attn), varlen + window"
    caps = KernelCaps(
        devices=_CUDA,
        dtypes=_HALF,
        lowering="varlen",
        backward_devices=_CUDA,
        max_head_dim=256,
        package="flash_attn",
        pip_name="flash-attn",
        min_compute_capability=(8, 0),
        adapter_ready=False,
    )


@register_kernel
class FA3Kernel(_GpuOnlyKernel):
    """FlashAttention 3 (Hopper build, ``flash_attn_interface``)."""

    name = "fa3"
    summary = "FlashAttention 3 (flash_attn_interface, Hopper), varlen + window"
    caps = KernelCaps(
        devices=_CUDA,
        dtypes=_HALF,
        lowering="varlen",
        backward_devices=_CUDA,
        max_head_dim=256,
        package="flash_attn_interface",
        pip_name="flash-attn-3 (built from the flash-attention repo's hopper/ directory)",
        min_compute_capability=(9, 0),
        adapter_ready=False,
    )


@register_kernel
class CudnnKernel(_GpuOnlyKernel):
    """cuDNN fused attention through TransformerEngine (thd layout, padding masks)."""

    name = "cudnn"
    summary = "cuDNN fused attention via TransformerEngine, varlen + window"
    caps = KernelCaps(
        devices=_CUDA,
        dtypes=_HALF,
        lowering="varlen",
        backward_devices=_CUDA,
        max_head_dim=256,
        package="transformer_engine",
        pip_name="transformer-engine[pytorch]",
        min_compute_capability=(8, 0),
        adapter_ready=False,
    )


@register_kernel
class FlashMaskKernel(_GpuOnlyKernel):
    """PaddlePaddle FlashMask (column-wise start/end row indices)."""

    name = "flashmask"
    summary = "FlashMask (paddle), column-wise row intervals"
    caps = KernelCaps(
        devices=_CUDA,
        dtypes=_HALF,
        lowering="flashmask",
        backward_devices=_CUDA,
        max_head_dim=256,
        per_head_masks=True,
        package="paddle",
        pip_name="paddlepaddle-gpu",
        min_compute_capability=(8, 0),
        adapter_ready=False,
    )


@register_kernel
class FFAKernel(_GpuOnlyKernel):
    """MagiAttention Flex-Flash-Attention: consumes the slices natively."""

    name = "ffa"
    summary = "MagiAttention FFA (magi_attention), slices natively"
    caps = KernelCaps(
        devices=_CUDA,
        dtypes=_HALF,
        lowering="ffa",
        backward_devices=_CUDA,
        head_dims=frozenset({64, 128}),
        package="magi_attention",
        pip_name="magi_attention (source build, Hopper/Blackwell)",
        min_compute_capability=(9, 0),
        adapter_ready=False,
    )
