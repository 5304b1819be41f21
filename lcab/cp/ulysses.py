"""Ulysses (DeepSpeed): all-to-all from sequence sharding to head sharding, local attention, back.

After the all-to-all a rank holds the *whole* sequence for Hq / U query heads (K/V heads
replicated first when U does not divide them) and runs one local call over the whole mask:
communication is exposed, compute perfectly balanced. Autograd flows through the all-to-alls,
so any kernel with a backward works.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import override

from lcab.cp.base import (
    HeadSplit,
    Plan,
    Strategy,
    StrategyOptions,
    element_bytes,
    register_strategy,
    step_mask,
)
from lcab.cp.comm import all_to_all, phase
from lcab.cp.prepared import CPPrepared, detached_leaves, leaf_grads
from lcab.cp.stages import Pricer, Stage, Window
from lcab.distributed.context import DistContext
from lcab.kernels import Kernel, PreparedAttention, Problem
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def seq_to_heads(x: torch.Tensor, group: Any, degree: int, op: str = "a2a") -> torch.Tensor:
    """(n, H, D) sequence shard → (degree·n, H/degree, D): all tokens of the group, my heads."""
    n, heads, dim = x.shape
    chunks = x.reshape(n, degree, heads // degree, dim).transpose(0, 1).contiguous()
    return all_to_all(chunks, group, op).reshape(degree * n, heads // degree, dim)


def heads_to_seq(y: torch.Tensor, group: Any, degree: int, op: str = "a2a") -> torch.Tensor:
    """Inverse of `seq_to_heads`: (degree·n, H/degree, D) → (n, H, D)."""
    total, local_heads, dim = y.shape
    n = total // degree
    back = all_to_all(y.reshape(degree, n, local_heads, dim), group, op)
    return back.transpose(0, 1).reshape(n, degree * local_heads, dim)


def replicate_kv(x: torch.Tensor, heads: HeadSplit) -> torch.Tensor:
    """K/V heads repeated ``kv_replication`` times (gradients sum back through autograd)."""
    return x.repeat_interleave(heads.kv_replication, dim=1) if heads.kv_replication > 1 else x


@functools.cache
def _timed_local_call() -> type[torch.autograd.Function]:
    """The autograd Function of the local call, made on first use (it needs torch: `lcab.lazy`)."""

    class TimedLocalCall(torch.autograd.Function):
        """The local kernel call, with its backward timed as ``compute`` too.

        Else autograd would run it between the all-to-all gradients outside any phase.
        """

        @staticmethod
        def forward(
            ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: PreparedAttention
        ) -> torch.Tensor:
            leaves = detached_leaves(q, k, v)
            with torch.enable_grad(), phase("compute"):
                out, _ = prepared.run(*(prepared.to_native(t) for t in leaves))
                out = prepared.from_native(out)
            ctx.graph = (leaves, out)
            return out.detach()

        @staticmethod
        def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            leaves, out = ctx.graph
            with phase("compute"):
                grads = leaf_grads(out, leaves, dout)
            return grads[0], grads[1], grads[2], None

    return TimedLocalCall


def local_call(
    prepared: PreparedAttention | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One kernel call in packed layout; an empty sub-mask gives zeros still tied to q."""
    if prepared is None:
        return q * 0, None  # keeps the autograd path (and so the collectives) of every rank
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _timed_local_call().apply(q, k, v, prepared), None
    with phase("compute"):
        out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
        return prepared.from_native(out), lse


def a2a_bytes(plan: Plan, problem: Problem) -> tuple[int, int]:
    """(q-sized, kv-sized) bytes one rank sends in one all-to-all of its Ulysses group.

    A direction's four (q, k, v in and out back; the backward's gradients) send 2q + 2kv.
    """
    n, u, h, elem = plan.shard_len, plan.ulysses, plan.heads, element_bytes(problem)
    per_call = [
        n * problem.heads_q * problem.head_dim * elem,
        n * h.heads_kv * h.kv_replication * problem.head_dim * elem,
    ]
    q, kv = (b * (u - 1) // u for b in per_call)
    return q, kv


def ulysses_ends(
    plan: Plan, problem: Problem, rank: int, bwd: bool, price: Pricer
) -> tuple[Stage, Stage]:
    """The exposed all-to-alls before and after a Ulysses group's local work (`lcab.cp.stages`).

    Forward: q, k, v in, the output back; backward: dout in, dq, dk, dv back. An
    implementation's layout copies around them (``ulysses_layout``) run before the first.
    """
    group = plan.grid(rank).my_ulysses_group()
    q, kv = a2a_bytes(plan, problem)
    op = "a2a_grad" if bwd else "a2a"
    tokens = plan.shard_len * plan.ulysses
    copies = price.copies("ulysses_layout", bwd, tokens, tokens)

    def stage(sizes: list[int], work: Any = None) -> Stage:
        moves = tuple(price.links.collective(op, "a2a", b, rank, group) for b in sizes)
        return Stage(work, after=moves)

    return stage([q] if bwd else [q, kv, kv], copies), stage([q, kv, kv] if bwd else [q])


@dataclass
class UlyssesOptions(StrategyOptions):
    """Ulysses shards heads, so every placement is balanced."""

    balance: str = "contiguous"
    """contiguous moves the fewest tokens (heads are sharded, so every placement balances)."""


@register_strategy
class Ulysses(Strategy):
    """Ulysses sequence parallelism over all ranks."""

    name = "ulysses"
    summary = "all-to-all sequence <-> heads, one local call over the whole sequence"
    merges_partials = False
    options_cls = UlyssesOptions

    @override
    def ulysses_degree(self, world: int) -> int:
        return world

    @override
    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        if plan.ulysses == 1:
            return {}
        q, kv = a2a_bytes(plan, problem)
        return {"a2a": 2 * q + 2 * kv, "a2a_grad": 2 * q + 2 * kv}

    @override
    def schedule(
        self, plan: Plan, problem: Problem, rank: int, bwd: bool, price: Pricer
    ) -> list[Window]:
        """The all-to-alls around one call over the group's tokens (the ring's one shard)."""
        before, after = ulysses_ends(plan, problem, rank, bwd, price)
        work, _ = price.call("ulysses", 0, 0, plan.grid(rank).ulysses_index, bwd)
        return [Window((before, Stage(work), after))]

    def build(
        self, plan: Plan, mask: AttnMask, problem: Problem, kernel: Kernel, dist: DistContext
    ) -> CPPrepared:
        """The callable of ``dist.rank``, with every step's kernel prepared."""
        grid = plan.grid(dist.rank)
        group, _ = grid.create_groups(dist)
        order = np.concatenate([plan.rank_layouts[r] for r in grid.my_ulysses_group()])
        sub = step_mask(mask, order, order, plan.heads, grid.ulysses_index)
        local = Problem(
            len(order),
            len(order),
            plan.heads.local_q,
            plan.heads.local_kv,
            problem.head_dim,
            problem.dtype,
            problem.device,
        )
        prepared = kernel.prepare(sub, local) if sub.num_slices else None
        u, heads = plan.ulysses, plan.heads

        def run(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
            k, v = replicate_kv(k, heads), replicate_kv(v, heads)
            qh, kh, vh = (seq_to_heads(t, group, u) for t in (q, k, v))
            out, _ = local_call(prepared, qh, kh, vh)
            return heads_to_seq(out, group, u), None

        return CPPrepared(plan, dist.rank, run, mask)
