"""Ring All-Gather (TransformerEngine / Llama-3 style): gather all K/V once, one local call.

The backward reduce-scatters dK/dV to their owners. No merging (one call sees every key), so
any kernel with a backward works; the price is holding every rank's K/V. An autograd Function,
so every rank runs the reduce-scatter even when its own queries attend nothing.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import override

from lcab.cp.base import Plan, Strategy, element_bytes, register_strategy, step_mask
from lcab.cp.comm import all_gather_raw, phase, reduce_scatter_raw
from lcab.cp.prepared import CPPrepared, detached_leaves, leaf_grads
from lcab.cp.stages import RUNNER, Implementation, Pricer, Stage, Window
from lcab.distributed.context import DistContext
from lcab.kernels import Kernel, PreparedAttention, Problem
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray

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


def _halves(plan: Plan, impl: Implementation) -> bool:
    return impl.allgather_halves and plan.placement.balancer == "zigzag"


def zigzag_halves(layout: IntArray, doc_lengths: IntArray, shards: int) -> list[IntArray]:
    """A zigzag shard's two halves: chunk ``p`` of every document, then chunk ``2P - 1 - p``.

    As the zigzag balancer lays them out; the published ``thd_read_half_tensor`` takes the same.
    """
    first, second, at = [], [], 0
    for length in doc_lengths.tolist():
        chunk = -(-int(length) // (2 * shards))
        first.append(layout[at : at + chunk])
        second.append(layout[at + chunk : at + 2 * chunk])
        at += 2 * chunk
    return [np.concatenate(first), np.concatenate(second)]


@register_strategy
class RingAllGather(Strategy):
    """All-gather K/V over all ranks, reduce-scatter dK/dV."""

    name = "ring_allgather"
    summary = "one all-gather of K/V, local queries against all keys, reduce-scatter of dK/dV"
    merges_partials = False

    @classmethod
    @override
    def block_sets(
        cls, plan: Plan, mask: AttnMask, impl: Implementation = RUNNER
    ) -> tuple[list[IntArray], list[IntArray]]:
        """Each rank's rows against every key, in the gathered order.

        A rank's rows are its two zigzag halves where the implementation calls them apart.
        """
        rows = list(plan.rank_layouts)
        if _halves(plan, impl):
            docs = mask.doc_lengths if mask.doc_lengths is not None else [mask.seqlen_q]
            rows = [h for r in rows for h in zigzag_halves(r, np.asarray(docs), len(rows))]
        return rows, [np.concatenate(plan.placement.layouts)]

    @override
    def schedule(
        self, plan: Plan, problem: Problem, rank: int, bwd: bool, price: Pricer
    ) -> list[Window]:
        """Gather K/V, the rank's call(s), reduce-scatter dK/dV (the backward's).

        Copies an implementation makes once per pass run first in the calls' stage: a rank's
        copies and calls add up before it waits for the collective.
        """
        links, calls = price.links, 2 if _halves(plan, price.impl) else 1
        moved, group = plan.comm_bytes.get("allgather_kv", 0), list(range(plan.world))
        gather = links.collective("allgather_kv", "allgather", moved, rank, group)
        scatter = links.collective("allgather_kv_grad", "reduce_scatter", moved, rank, group)
        works = [price.call("allgather", rank * calls + c, 0, 0, bwd)[0] for c in range(calls)]
        once = price.copies("allgather_once", bwd, plan.shard_len, plan.shard_len * plan.world)
        works = [once, *works] if once is not None else works
        stages = [Stage(works[0], then=tuple(works[1:]))]
        if moved and (not bwd or price.impl.regather_bwd):
            stages.insert(0, Stage(None, after=(gather,)))
        if moved and bwd:
            stages.append(Stage(None, after=(scatter,)))
        return [Window(tuple(stages))]

    @classmethod
    @override
    def buffers(cls, plan: Plan, problem: Problem, backward: bool) -> dict[str, float]:
        """Every rank's K and V, gathered (and their gradients, reduce-scattered)."""
        shard = plan.shard_len * problem.heads_kv * problem.head_dim * element_bytes(problem)
        terms = {"gathered k, v": 2.0 * plan.ring * shard}
        return terms | ({"gathered dk, dv": terms["gathered k, v"]} if backward else {})

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
