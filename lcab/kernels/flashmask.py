"""FlashMask V3 adapter, through the PyTorch build of PaddlePaddle/flash-attention's FlashMask.

PaddlePaddle's own ``paddle.nn.functional.flashmask_attention`` needs Paddle 3.x GPU wheels,
which PyPI does not serve (its ``paddlepaddle-gpu`` 2.6.2 predates FlashMask), and it would time
Paddle tensors copied out of torch. The repository's ``flashmask_attention_v3/setup_torch.py``
builds the same kernel as a torch extension: distribution ``flashmask`` 3.0.0b1, Python module
**``interface_torch``** (the module name ``flashmask_interface`` that this adapter once imported
exists only in the unmerged PR #98, so lcab always reported FlashMask as not installed). Every
call, keyword and fact here comes from the table `lcab.kernels.upstream.flashmask` (rows
``FLASHMASK_ATTENTION``, ``FLASHMASK_BWD``), read at PaddlePaddle/flash-attention 9985af53.
**CPU contract-tested only** (a stand-in module built from those rows, never the CUDA kernel):
the first GPU run must confirm it.

The mask is lowered once, in `prepare`, by `lcab.masks.lowering.to_flashmask`: int32
``startend_row_indices`` (1, H_mask, Sk, C) with H_mask 1 or Hkv (per-KV-head masks are
native) and the ``causal`` flag. The kernel applies the column intervals as absolute row
intervals, which is what the lowering states, so every mask the lowering expresses runs, on any
rectangle: the lowering uses FlashMask's causal flag (bottom-right aligned, FA3's causal mask)
only on square masks, where it means rows >= j, and states a context-parallel block's rows
without it. The call takes (1, S, H, D) views.

Backward: autograd through ``out`` (``FlashMaskFunc.backward`` ignores the LSE's gradient, so
``lse_grad`` is False), and, for ring-style context parallelism, from merged softmax statistics
(``stats_backward``): `_PreparedFlashMask.backward` calls the interface's own backward op
``flashmask_cuda.bwd`` (``torch.ops.flashmask.bwd``) with the merged ``out`` and LSE, as
``FlashMaskFunc.backward`` calls it with its saved ones and as ring-flash-attn calls FA2's
``_flash_attn_backward``.

Reasons (`FlashMaskKernel.extra_reasons`): the head dim must be a multiple of 8 (the kernel
checks, it does not pad); ``FLAGS_flash_attn_version`` other than 3 (unset means 3; the
interface raises NotImplementedError for 2, ValueError for anything else); and
``FLAGS_cudnn_deterministic=1`` with a head dim above 128, which sends the interface to its
version-2 path (NotImplementedError).

LSE: ``return_softmax_lse=True`` → ``[out, lse]``, natural log, (B, Hq, Sq) float32
(`lse_to_lcab` refuses any other shape rather than transpose silently). Rows attending no key
get lcab's out 0 / lse -inf from the mask.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, cast

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
from lcab.kernels.library_results import LibraryCall, LseLayout
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
#: The LSE's layout, as the table's row states it ((B, Hq, Sq)).
LSE_LAYOUT = cast(LseLayout, FLASHMASK_ATTENTION.lse.layout if FLASHMASK_ATTENTION.lse else None)


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
        return self.convention(result[0].squeeze(0), result[1], LSE_LAYOUT, q.dtype)

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """(dq, dk, dv) of this block of keys under the merged (out, lse): FlashMask's own op.

        ``flashmask_cuda.bwd`` takes ``out`` and ``softmax_lse`` as given, so the merged
        statistics of a ring step go in where ``FlashMaskFunc.backward`` passes its saved ones:
        the LSE as (1, Hq, Sq), which is lcab's (Hq, Sq) with the batch put back. Rows with no
        key anywhere (merged LSE -inf) are read as 0 by the kernel, where their every score is
        masked; rows with no key in this block are masked in it.
        """
        dq, dk, dv = self.bwd(
            dout=dout.unsqueeze(0).contiguous(),
            q=q.unsqueeze(0),
            k=k.unsqueeze(0),
            v=v.unsqueeze(0),
            out=out.unsqueeze(0).contiguous(),
            softmax_lse=lse.unsqueeze(0).contiguous(),
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
