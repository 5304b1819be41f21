"""Naive attention: explicit softmax(QKᵀ·scale + mask)·V in the input dtype, O(S²) memory.

The paper's baseline: materialises the full score matrix, any mask via the dense lowering.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from typing_extensions import override

from lcab.kernels.base import Kernel, Output, PreparedAttention, Problem, torch_caps
from lcab.kernels.registry import register_kernel
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())


class _PreparedNaive(PreparedAttention):
    layout = "bhsd"
    lse_grad = True  # plain torch ops: autograd reaches q/k/v through the LSE

    def __init__(self, mask: AttnMask, problem: Problem) -> None:
        dense = mask.to_dense(max_elements=1 << 40).to(problem.device)
        if dense.dim() == 3:  # per KV head: expand to query heads
            dense = dense.repeat_interleave(problem.heads_q // mask.num_heads, dim=0)
        self.bias = torch.zeros(dense.shape, dtype=problem.torch_dtype, device=problem.device)
        self.bias.masked_fill_(~dense, float("-inf"))
        self.empty = (
            (~dense.any(-1))
            .reshape(1, -1, dense.shape[-2], 1)
            .expand(1, problem.heads_q, dense.shape[-2], 1)
        )
        self.has_empty = bool(self.empty.any())
        self.group = problem.gqa_group
        self.scale = 1.0 / math.sqrt(problem.head_dim)

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)
            v = v.repeat_interleave(self.group, dim=1)
        # in place: matmul's backward needs q and k, not its output (one S² pass saved each)
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scale).add_(self.bias)
        wide = scores.to(torch.promote_types(scores.dtype, torch.float32))  # softmax in >= fp32
        if self.has_empty:
            # rows with no key: softmax over zeros instead of -inf (finite gradients), zeroed later
            wide = wide.masked_fill(self.empty, 0.0)
        lse = torch.logsumexp(wide, dim=-1)
        probs = torch.softmax(wide, dim=-1)
        if self.has_empty:
            probs = probs.masked_fill(self.empty, 0.0)
            lse = lse.masked_fill(self.empty[..., 0], float("-inf"))
        return torch.matmul(probs.to(q.dtype), v), lse[0]


@register_kernel
class NaiveKernel(Kernel):
    """Explicit softmax(QKᵀ)V with a dense mask (the paper's "naive torch")."""

    name = "naive"
    colour = "#8c564b"
    summary = "explicit softmax(QK^T)V with the dense mask, O(S^2) memory"
    caps = torch_caps("dense")

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return _PreparedNaive(mask, problem)
