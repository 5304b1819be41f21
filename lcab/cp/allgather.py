"""Ring All-Gather (TransformerEngine / Llama-3 style): gather all K/V once, one local call.

The backward reduce-scatters dK/dV back to their owners. Unlike Ring P2P there is no merging (one
call sees every key), so any kernel with a backward works; the price is holding every rank's
K/V at once. Written as an autograd Function so every rank runs the reduce-scatter even when its
own queries attend nothing.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import override

from lcab.cp.base import Plan, Strategy, element_bytes, register_strategy, step_mask
from lcab.cp.comm import all_gather_raw, phase, reduce_scatter_raw
from lcab.cp.inner_graph import detached_leaves, leaf_grads
from lcab.cp.prepared import CPPrepared
from lcab.distributed.context import DistContext
from lcab.kernels import Kernel, PreparedAttention, Problem
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


@functools.cache
def _all_gather_attention() -> type[torch.autograd.Function]:
    """The autograd Function of Ring All-Gather, made on first use.

    Defining it needs torch, which the planner and the dry run never load (`lcab.lazy`).
    """

    class AllGatherAttention(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            prepared: PreparedAttention | None,
            group: Any,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            k_all = all_gather_raw(k, group, "allgather_kv")
            v_all = all_gather_raw(v, group, "allgather_kv")
            leaves = detached_leaves(q, k_all, v_all)
            with torch.enable_grad(), phase("compute"):
                if prepared is None:
                    out = leaves[0] * 0
                    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
                else:
                    native = [prepared.to_native(t) for t in leaves]
                    out_n, lse_n = prepared.run(*native)
                    out = prepared.from_native(out_n)
                    lse = (
                        lse_n
                        if lse_n is not None
                        else torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device)
                    )
            ctx.graph = (leaves, out)
            ctx.group = group
            ctx.mark_non_differentiable(lse)
            return out.detach(), lse.detach()

        @staticmethod
        def backward(
            ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
            leaves, out = ctx.graph
            with phase("compute"):
                grads = leaf_grads(out, leaves, dout)
            dk = reduce_scatter_raw(grads[1], ctx.group, "allgather_kv_grad")
            dv = reduce_scatter_raw(grads[2], ctx.group, "allgather_kv_grad")
            return grads[0], dk, dv, None, None

    return AllGatherAttention


@register_strategy
class RingAllGather(Strategy):
    """All-gather K/V over all ranks, reduce-scatter dK/dV."""

    name = "ring_allgather"
    summary = "one all-gather of K/V, local queries against all keys, reduce-scatter of dK/dV"
    merges_partials = False

    @override
    def blocks(self, plan: Plan) -> list[tuple[Any, Any]]:
        """Each rank's rows against every key, in the gathered order."""
        keys = np.concatenate(plan.placement.layouts)
        return [(rows, keys) for rows in plan.rank_layouts]

    @override
    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        if plan.ring == 1:
            return {}
        shard = plan.shard_len * problem.heads_kv * problem.head_dim * element_bytes(problem)
        moved = 2 * (plan.ring - 1) * shard
        return {"allgather_kv": moved, "allgather_kv_grad": moved}

    def build(
        self, plan: Plan, mask: AttnMask, problem: Problem, kernel: Kernel, dist: DistContext
    ) -> CPPrepared:
        """The callable of ``dist.rank``, with every step's kernel prepared."""
        rows = plan.rank_layouts[dist.rank]
        keys = np.concatenate(plan.placement.layouts)
        heads = plan.heads if mask.num_heads > 1 else None
        sub = step_mask(mask, rows, keys, heads, 0)
        local = Problem(
            len(rows),
            len(keys),
            problem.heads_q,
            problem.heads_kv,
            problem.head_dim,
            problem.dtype,
            problem.device,
        )
        prepared = kernel.prepare(sub, local) if sub.num_slices else None
        group = dist.group(list(range(plan.world)))

        def run(q: Any, k: Any, v: Any) -> Any:
            return _all_gather_attention().apply(q, k, v, prepared, group)

        return CPPrepared(plan, dist.rank, run, mask)
