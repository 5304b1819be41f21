"""FlashMask V3 adapter, through the PyTorch build (module ``interface_torch``) of FlashMask.

Paddle's own ``flashmask_attention`` needs Paddle 3.x GPU wheels PyPI does not serve, and would
time tensors copied out of torch. CPU contract-tested only; every call and fact is a row of
`lcab.kernels.upstream.flashmask`. The lowering (`to_flashmask`) gives absolute row intervals,
which is what the kernel applies, so every mask it expresses runs on any rectangle. The backward
from merged statistics calls the interface's own ``flashmask_cuda.bwd`` with the merged out/LSE.
"""

from __future__ import annotations

import importlib
import os
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
from lcab.kernels.library_results import LibraryCall, lse_reading
from lcab.kernels.packages import ApiNeed, PackageProbe
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream.flashmask import (
    DISTRIBUTION,
    FLASHMASK_ATTENTION,
    FLASHMASK_BWD,
    MODULE,
    VERSION,
)
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering import to_flashmask

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

#: Keywords the adapter passes to ``flashmask_attention`` (after q, k, v by position).
FLASHMASK_KWARGS = ("startend_row_indices", "causal", "return_softmax_lse", "softmax_scale")
#: Keywords the adapter passes to the backward op (all of them: a torch op takes keywords).
BWD_KWARGS = ("dout", "q", "k", "v", "out", "softmax_lse", "startend_row_indices",
              "softmax_scale", "is_causal", "deterministic")  # fmt: skip
VERSION_FLAG = "FLAGS_flash_attn_version"
DETERMINISTIC_FLAG = "FLAGS_cudnn_deterministic"
FOLLOWS = f"the torch build of FlashMask V3, {DISTRIBUTION} {VERSION}"
LSE_FACTOR, LSE_LAYOUT = lse_reading(FLASHMASK_ATTENTION)


def _deterministic() -> bool:
    """What the interface reads for its ``deterministic`` (``interface_torch.py`` L870-871)."""
    return os.environ.get(DETERMINISTIC_FLAG, "0") == "1"


class _PreparedFlashMask(LibraryCall):
    """The column indices on the device, the call's keywords, and the empty rows."""

    library = "FlashMask"
    follows = FOLLOWS

    def __init__(self, mask: AttnMask, problem: Problem, module: Any) -> None:
        args = to_flashmask(mask)
        self.fn = getattr(module, FLASHMASK_ATTENTION.name)
        self.bwd = module
        for name in FLASHMASK_BWD.name.split("."):  # flashmask_cuda.bwd
            self.bwd = getattr(self.bwd, name)
        self.expect(mask, problem, per_query_head=True)
        indices = torch.from_numpy(np.ascontiguousarray(args.startend_row_indices))
        self.kwargs: dict[str, Any] = {
            "startend_row_indices": indices.to(torch.int32).to(problem.device).contiguous(),
            "causal": bool(args.causal),
            "return_softmax_lse": True,
            "softmax_scale": problem.head_dim**-0.5,
        }

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        result = self.fn(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), **self.kwargs)
        return self.convention(result[0].squeeze(0), result[1] * LSE_FACTOR, LSE_LAYOUT, q.dtype)

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """(dq, dk, dv) under the merged (out, lse): FlashMask's ``bwd`` op, given them as-is."""
        batched = (t.unsqueeze(0).contiguous() for t in (dout, q, k, v, out, lse))
        dq, dk, dv = self.bwd(
            **dict(zip(BWD_KWARGS[:6], batched, strict=True)),
            startend_row_indices=self.kwargs["startend_row_indices"],
            softmax_scale=self.kwargs["softmax_scale"],
            is_causal=self.kwargs["causal"],
            deterministic=_deterministic(),
        )
        return dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)


@register_kernel
class FlashMaskKernel(Kernel):
    """FlashMask V3 (torch build), column-wise row intervals (CPU contract-tested)."""

    name = "flashmask"
    summary = "FlashMask V3 (torch build), column-wise row intervals"
    colour = "#2ca02c"
    gpu_compared = True
    caps = cuda_adapter_caps(
        "flashmask",
        max_head_dim=256,
        per_head_masks=True,
        requires=PackageProbe(
            module=MODULE,
            distributions=(DISTRIBUTION,),
            install="bash launchers/wheelhouse.sh build flashmask",
            note="PaddlePaddle/flash-attention's PyTorch build (flashmask_attention_v3/"
            "setup_torch.py), 20 min on 2 cores; the paddlepaddle-gpu on PyPI predates FlashMask",
            needs=(
                ApiNeed(FLASHMASK_ATTENTION.name, FLASHMASK_KWARGS, positional=3),
                ApiNeed(FLASHMASK_BWD.name, BWD_KWARGS, positional=0),
            ),
            min_version="3.0",
            requirement=f"the torch build of FlashMask V3, {DISTRIBUTION} >= {VERSION}",
        ),
        min_compute_capability=(9, 0),
        stats_backward=True,
    )

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        reasons = []
        if problem.head_dim % 8:
            reasons.append(
                f"FlashMask needs head_dim % 8 == 0 and does not pad (head_dim {problem.head_dim})"
            )
        flag = os.environ.get(VERSION_FLAG)
        if flag is not None and flag.strip() != "3":
            reasons.append(f"{VERSION_FLAG}={flag} selects a FlashMask path other than V3")
        if _deterministic() and problem.head_dim > 128:
            reasons.append(
                f"{DETERMINISTIC_FLAG}=1 with head_dim {problem.head_dim} > 128 sends "
                "FlashMask to its version-2 path, which raises NotImplementedError"
            )
        return reasons

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        return _PreparedFlashMask(mask, problem, module)
