"""The tiled engine of the ``ranges`` and ``sparse`` kernels: running a plan forward and backward.

* Forward: ``S = (q·scale) kᵀ`` plus a `MASKED` bias only in the batch's mask windows, an
  in-place softmax in float32, and ``lse = max(S) − log(max P)`` (no second exp pass); parts of
  rows split over batches merge by log-sum-exp in later waves.
* Backward (not autograd through the loop): P recomputed from the saved lse,
  ``dS = P ⊙ (dP − δ)``, dq/dk/dv accumulated in float32 per worker.
* GQA never repeats K/V: a KV head's G query heads are G·rows rows of one matmul.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from lcab.kernels.base import Grads, Output, PreparedAttention, Problem, lse_dtype
from lcab.kernels.tiled.buffers import (
    Buffers,
    accumulator,
    lse_out,
    rows_out,
    zeros_with_trash,
)
from lcab.kernels.tiled.items import WorkItems
from lcab.kernels.tiled.plan import EMPTY_LSE, MASKED, Batch, TiledPlan
from lcab.kernels.tiled.workers import run_queue, scratch, worker_count
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())


def _bmm(slot: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ b (same dtype) into this thread's scratch ``slot``."""
    shape = (a.shape[0], a.shape[1], b.shape[2])
    out = scratch(slot, shape[0] * shape[1] * shape[2], a.dtype, a.device).view(shape)
    return torch.bmm(a, b, out=out)


def _matmul(slot: str, a: torch.Tensor, b: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """A @ b into this thread's scratch ``slot``, as an ``acc``-dtype tensor."""
    shape = (a.shape[0], a.shape[1], b.shape[2])
    numel = shape[0] * shape[1] * shape[2]
    out = scratch(slot, numel, acc, a.device).view(shape)
    if a.dtype == acc:
        return torch.bmm(a, b, out=out)
    low = scratch(slot + ".low", numel, a.dtype, a.device).view(shape)  # a may be in "cast"
    return out.copy_(torch.bmm(a, b, out=low))


def _in_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to ``dtype`` through the thread's cast scratch (no copy when equal)."""
    if x.dtype == dtype:
        return x
    return scratch("cast", x.numel(), dtype, x.device).view(x.shape).copy_(x)


def _scores(
    plan: TiledPlan, batch: Batch, qb: torch.Tensor, kb: torch.Tensor, acc: torch.dtype
) -> torch.Tensor:
    """Masked scores (N, rows·G, keys) in ``acc`` dtype (q is pre-scaled), in scratch.

    Masks are added as a bias: on CPU about 7x faster than ``masked_fill_``.
    """
    scores = _matmul("scores", qb, kb.transpose(1, 2), acc)
    if batch.windows:
        shaped = scores.view(-1, batch.items, batch.rows, plan.group, scores.shape[-1])
        for c0, c1, blocked in batch.windows:
            shaped[..., c0:c1].add_(blocked.unsqueeze(2) * MASKED)
    return scores


def _softmax_lse(scores: torch.Tensor, with_lse: bool = True) -> tuple[torch.Tensor, Any]:
    """Row softmax in place (fused: 2x a separate ``exp_`` on CPU) and lse = max(S) − log(max P)."""
    peak = scores.amax(-1, keepdim=True) if with_lse else None
    probs = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    if peak is None:
        return probs, None
    return probs, peak.sub_(probs.amax(-1, keepdim=True).log_())


def _forward_batch(buf: Buffers, batch: Batch, out: torch.Tensor, lse: torch.Tensor) -> None:
    """One batch: its (out, lse) written, or merged by log-sum-exp in later waves."""
    acc = buf.acc
    qb = buf.fetch_q(batch)
    kb, vb = buf.fetch_kv(batch)
    probs, part_lse = _softmax_lse(_scores(buf.plan, batch, qb, kb, acc))
    o = _matmul("o", _in_dtype(probs, vb.dtype), vb, acc)
    if batch.may_empty:  # rows whose keys are all masked here: out 0, lse -inf
        empty = part_lse < EMPTY_LSE
        part_lse.masked_fill_(empty, -math.inf)
        o.masked_fill_(empty, 0.0)
    if batch.wave:
        old_lse = buf.get_rows(batch, lse)
        new_lse = torch.logaddexp(old_lse, part_lse)
        safe = new_lse.clamp(min=torch.finfo(acc).min)
        o = (
            buf.get_rows(batch, out)
            .mul_((old_lse - safe).exp_())
            .add_(o.mul_((part_lse - safe).exp_()))
        )
        part_lse = new_lse
    buf.put_rows(batch, out, o)
    buf.put_rows(batch, lse, part_lse)


def _backward_batch(
    buf: Buffers,
    batch: Batch,
    go: torch.Tensor,
    delta: torch.Tensor,
    lse: torch.Tensor,
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    external: bool = False,
) -> None:
    """One batch's contribution to (dq / scale, dk, dv); P recomputed from the saved lse.

    ``external``: the lse is not this plan's own (ring CP merged it over other key blocks), so
    every batch rescales — a batch covering all of its rows' keys here is only part of them.
    """
    acc = buf.acc
    dq, dk, dv = grads
    qb = buf.fetch_q(batch)
    kb, vb = buf.fetch_kv(batch)
    gob = buf.get_rows(batch, go)
    rescale = batch.rescale or external
    probs, local = _softmax_lse(_scores(buf.plan, batch, qb, kb, acc), rescale)
    if rescale:  # P = exp(S - lse): this batch saw only some keys of its rows
        probs.mul_(local.sub_(buf.get_rows(batch, lse)).exp_())
    buf.add_keys(batch, dv, _bmm("grad", _in_dtype(probs, qb.dtype).transpose(1, 2), gob))
    ds = _matmul("dprobs", gob, vb.transpose(1, 2), acc)
    ds.sub_(buf.get_rows(batch, delta)).mul_(probs)
    ds_in = _in_dtype(ds, qb.dtype)
    buf.add_rows(batch, dq, _bmm("grad", ds_in, kb))
    buf.add_keys(batch, dk, _bmm("grad", ds_in.transpose(1, 2), qb))


def plan_forward(
    plan: TiledPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, Buffers]:
    """(out (Sq, Hq, D), lse (Hq, Sq), buffers kept for the backward)."""
    buf = Buffers.of(plan, q, k, v)
    width = buf.q.shape[1]
    out = accumulator(plan, width, buf.acc, q.device, 0.0)
    lse = accumulator(plan, plan.group, buf.acc, q.device, -math.inf)
    workers = worker_count(q.device)
    for wave in plan.wave_batches():  # batches of a wave write disjoint rows
        run_queue(wave, lambda batch, _: _forward_batch(buf, batch, out, lse), workers)
    buf.lse = lse
    return rows_out(plan, out).to(q.dtype), lse_out(plan, lse), buf


def plan_backward(
    plan: TiledPlan,
    saved: tuple[torch.Tensor, ...],
    dout: torch.Tensor | None,
    dlse: torch.Tensor | None,
    external: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from the saved (q, k, v, out, packed lse) and the output gradients.

    ``external``: (out, lse) are the merged statistics of whole rows, not this plan's own.
    """
    q, k, v, out, packed_lse = saved
    buf = Buffers.of(plan, q, k, v)
    acc, g, width = buf.acc, plan.group, buf.q.shape[1]
    rows = buf.q.shape[0] + 1  # with the trash row
    if dout is None:
        go = torch.zeros(rows, width, dtype=buf.dtype, device=q.device)
    else:
        go = zeros_with_trash(dout.reshape(-1, width), buf.dtype)
    delta = torch.zeros(rows, g, dtype=acc, device=q.device)
    delta[:-1] = (go[:-1].to(acc).view(rows - 1, g, -1) * out.reshape(rows - 1, g, -1)).sum(-1)
    if dlse is not None:  # d lse / d S = P, so dLSE enters dS as a shift of delta
        delta[:-1] -= dlse.to(acc).t().reshape(-1, g)
    lse = packed_lse.masked_fill(torch.isinf(packed_lse), 0.0)
    workers = worker_count(q.device)
    grads = [  # per worker: batches of any wave may add to the same rows and keys
        (
            torch.zeros(rows, width, dtype=acc, device=q.device),
            torch.zeros(buf.k.shape, dtype=acc, device=q.device),
            torch.zeros(buf.v.shape, dtype=acc, device=q.device),
        )
        for _ in range(workers)
    ]
    batches = sorted(plan.batches, key=lambda b: -b.cost)
    run_queue(
        batches, lambda b, w: _backward_batch(buf, b, go, delta, lse, grads[w], external), workers
    )
    dq, dk, dv = (sum(x[1:], x[0]) for x in zip(*grads, strict=True))
    shape_k = (plan.seqlen_k, plan.heads_kv, -1)
    return (
        rows_out(plan, dq).mul(buf.scale).to(buf.dtype),
        dk.view(shape_k).to(buf.dtype),
        dv.view(shape_k).to(buf.dtype),
    )


@functools.cache
def tiled_attention_function() -> type[torch.autograd.Function]:
    """`TiledAttention`, made on first use (defining it needs torch: `lcab.lazy`)."""

    class TiledAttention(torch.autograd.Function):
        """Forward and backward of a `TiledPlan` (returns out and the lse, float32 or float64)."""

        @staticmethod
        def forward(
            ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: TiledPlan
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """(out, lse) of the plan; keeps the packed tensors for the backward."""
            out, lse, buf = plan_forward(plan, q, k, v)
            ctx.plan = plan
            # Saved the autograd way: in-place changes before backward raise instead of corrupting.
            ctx.save_for_backward(q, k, v, out, buf.lse)
            return out, lse

        @staticmethod
        def backward(
            ctx: Any, dout: torch.Tensor | None, dlse: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
            """(dq, dk, dv) from dout and dlse (P recomputed per batch from the saved lse)."""
            dq, dk, dv = plan_backward(ctx.plan, ctx.saved_tensors, dout, dlse)
            return dq, dk, dv, None

    return TiledAttention


def tiled_attention(
    plan: TiledPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``plan`` on packed q (Sq, Hq, D), k/v (Sk, Hkv, D); differentiable when needed."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        out, lse = tiled_attention_function().apply(q, k, v, plan)
        return out, lse
    out, lse, _ = plan_forward(plan, q, k, v)
    return out, lse


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
