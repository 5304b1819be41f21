"""`PreparedTiled`: what the ``ranges`` and ``sparse`` kernels return from ``prepare``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lcab.kernels.base import Grads, Output, PreparedAttention, Problem, lse_dtype
from lcab.kernels.tiled.engine import plan_backward, tiled_attention
from lcab.kernels.tiled.items import WorkItems
from lcab.kernels.tiled.plan import TiledPlan
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())


class PreparedTiled(PreparedAttention):
    """A `TiledPlan` bound to its problem; ``run`` is differentiable (real backward)."""

    layout = "shd"

    def __init__(self, plan: TiledPlan) -> None:
        self.plan = plan

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        """(out, lse) of packed q/k/v; autograd runs the engine's own backward."""
        return tiled_attention(self.plan, q, k, v)

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """The engine's backward fed the merged statistics (out, lse) of whole rows (ring CP)."""
        plan = self.plan
        rows = plan.heads_kv * plan.seqlen_q
        packed = torch.full(
            (rows + 1, plan.group), -math.inf, dtype=lse_dtype(q.dtype), device=q.device
        )
        packed[:rows] = lse.to(packed.dtype).t().reshape(rows, plan.group)
        return plan_backward(plan, (q, k, v, out, packed), dout, None, external=True)


def plan_for(mask: AttnMask, problem: Problem, items: WorkItems) -> TiledPlan:
    """Compile ``items`` for ``problem`` (head-shared masks run every KV head in one batch)."""
    return TiledPlan(
        items,
        seqlen_q=problem.seqlen_q,
        seqlen_k=problem.seqlen_k,
        heads_q=problem.heads_q,
        heads_kv=problem.heads_kv,
        shared=mask.num_heads == 1,
        device=problem.torch_device,
    )
