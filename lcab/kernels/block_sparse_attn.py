"""MIT-Han-Lab Block-Sparse-Attention (``block_sparse_attn.block_sparse_attn_func``): FA2 Sparse.

CPU contract-tested only. The library computes whole 128x128 tiles (hard-coded in its wrapper),
so only masks whose touched tiles are all full run (`partial_tile_reason`). One varlen sequence,
``head_mask_type`` all ones (the wrapper renumbers them itself), a bool ``base_blockmask`` per
query head built in `prepare`; the call and its LSE (FA2's, not differentiable, so no backward
from merged statistics) are the row of `lcab.kernels.upstream.block_sparse_attn`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import override

from lcab.kernels.base import (
    Kernel,
    Output,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
)
from lcab.kernels.block_grid import partial_tile_reason
from lcab.kernels.library_results import LibraryCall, lse_reading
from lcab.kernels.packages import ApiNeed, PackageProbe
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream import block_sparse_attn as upstream
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.geometry import SliceKind
from lcab.masks.lowering.blocks import block_table

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

BLOCK = 128
"""The library's block size (``128, 128`` hard-coded in ``block_sparse_attn_func``)."""
BSA_KWARGS = (
    "cu_seqlens_q",
    "cu_seqlens_k",
    "head_mask_type",
    "streaming_info",
    "base_blockmask",
    "max_seqlen_q_",
    "max_seqlen_k_",
    "p_dropout",
    "softmax_scale",
    "is_causal",
    "return_attn_probs",
)
"""Keywords the adapter passes to ``block_sparse_attn_func`` (after q, k, v by position)."""
FOLLOWS = "Block-Sparse-Attention v0.0.2 (block_sparse_attn_func, return_attn_probs=True)"


LSE_FACTOR, LSE_LAYOUT = lse_reading(upstream.BLOCK_SPARSE_ATTN_FUNC)


def aligned_full_slices(mask: AttnMask, block: int = BLOCK) -> bool:
    """Whether every slice is ``full`` with edges on the block grid (or at the sequence end).

    Then every touched tile is full, decided in O(slices) without building the block table
    (seconds for a 1M-token ``block_sparse`` mask).
    """
    s = mask.slices

    def on_grid(edge: np.ndarray, length: int) -> np.ndarray:
        return (edge % block == 0) | (edge == length)

    return bool(
        (s[:, 4] == SliceKind.FULL).all()
        and on_grid(s[:, 0], mask.seqlen_q).all()
        and on_grid(s[:, 1], mask.seqlen_q).all()
        and on_grid(s[:, 2], mask.seqlen_k).all()
        and on_grid(s[:, 3], mask.seqlen_k).all()
    )


def kept_blocks(mask: AttnMask, block: int = BLOCK) -> torch.Tensor:
    """Bool (mask heads, ceil(Sq/block), ceil(Sk/block)): the touched tiles of each mask head."""
    n_q, n_k = -(-mask.seqlen_q // block), -(-mask.seqlen_k // block)
    if not aligned_full_slices(mask, block):
        return block_table(mask, block, block).dense_blocks() > 0
    s = mask.slices
    head = np.repeat(np.arange(mask.num_heads), np.diff(mask.head_ptr))
    q0, k0 = s[:, 0] // block, s[:, 2] // block
    q1, k1 = -(-s[:, 1] // block), -(-s[:, 3] // block)
    diff = np.zeros((mask.num_heads, n_q + 1, n_k + 1), dtype=np.int32)
    for rows, cols, sign in ((q0, k0, 1), (q0, k1, -1), (q1, k0, -1), (q1, k1, 1)):
        np.add.at(diff, (head, rows, cols), sign)
    covered = diff.cumsum(axis=1).cumsum(axis=2)[:, :n_q, :n_k] > 0
    return torch.from_numpy(covered)


def full_tile_reason(mask: AttnMask) -> str | None:
    """None when the library is exact for ``mask`` (all touched 128x128 tiles full), else why."""
    return None if aligned_full_slices(mask) else partial_tile_reason(mask, BLOCK, BLOCK)


class _PreparedBSA(LibraryCall):
    """The block mask and the call's keywords on the device, and the empty rows."""

    library = "Block-Sparse-Attention"
    follows = FOLLOWS

    def __init__(self, mask: AttnMask, problem: Problem, fn: Callable[..., Any]) -> None:
        device, hq = problem.device, problem.heads_q
        self.fn = fn
        self.expect(mask, problem)
        blocks = kept_blocks(mask)  # (mask heads, nqb, nkb)
        # one mask per query head: the kernel reads base_blockmask[:, head_mask_type[h] - 1]
        per_query_head = blocks.repeat_interleave(hq // blocks.shape[0], dim=0)
        cu_q = torch.tensor([0, problem.seqlen_q], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, problem.seqlen_k], dtype=torch.int32, device=device)
        self.kwargs: dict[str, Any] = {
            "cu_seqlens_q": cu_q,
            "cu_seqlens_k": cu_k,
            # all ones: the wrapper numbers them 1..Hq itself (see the module docstring)
            "head_mask_type": torch.ones(hq, dtype=torch.int32, device=device),
            "streaming_info": torch.zeros(2 * hq, dtype=torch.int32, device=device),
            "base_blockmask": per_query_head.unsqueeze(0).to(device).contiguous(),
            "max_seqlen_q_": int(problem.seqlen_q),
            "max_seqlen_k_": int(problem.seqlen_k),
            "p_dropout": 0.0,
            "softmax_scale": problem.head_dim**-0.5,
            "is_causal": False,
            "return_attn_probs": True,
        }

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        out, lse, _ = self.fn(q, k, v, **self.kwargs)
        # +inf on empty rows in the library (FA2 code): lcab's convention is out 0, lse -inf
        return self.convention(out, lse.detach() * LSE_FACTOR, LSE_LAYOUT, q.dtype)


@register_kernel
class BlockSparseAttnKernel(Kernel):
    """FA2 Sparse: whole 128x128 tiles from a per-head block mask (CPU contract-tested)."""

    name = "sparse_fa2"
    colour = "#e7ba52"
    summary = "Block-Sparse-Attention (block_sparse_attn, FA2 Sparse), 128x128 full tiles"
    caps = cuda_adapter_caps(
        "block_table",
        head_dims=frozenset({32, 64, 128}),  # README; HEADDIM_SWITCH builds 32/64/128 only
        per_head_masks=True,
        requires=PackageProbe(
            module=upstream.MODULE,
            distributions=("block_sparse_attn", "block-sparse-attn"),
            install="bash launchers/wheelhouse.sh build bsa",
            note="mit-han-lab/Block-Sparse-Attention, 23 min on 2 cores",
            needs=(ApiNeed(upstream.BLOCK_SPARSE_ATTN_FUNC.name, BSA_KWARGS, positional=3),),
            min_version="0.0.2",
            requirement=">= 0.0.2 (the Dec 2025 source tree with Hopper/Blackwell builds)",
        ),
        min_compute_capability=(8, 0),
    )

    @override
    def mask_reasons(self, mask: AttnMask) -> list[str]:
        reasons = super().mask_reasons(mask)
        why = None if reasons else full_tile_reason(mask)
        return reasons + ([f"mask not expressible as 128x128 blocks: {why}"] if why else [])

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        return _PreparedBSA(mask, problem, getattr(module, upstream.BLOCK_SPARSE_ATTN_FUNC.name))
