"""Ring executors: K/V blocks travel around a ring while each rank attends to the block in hand.

`RingAttention` runs a `RingSpec` (the plain ring is one window; LoongTrain's has several). It
is an autograd Function with an explicit backward because the backward moves data too: K/V
travel again and each block's dK/dV accumulator follows its block home — no all-reduce.

Each step computes local queries against one block with the step's own sub-mask (an empty one
skips the compute, not the transfer); partials merge by log-sum-exp in float32 (float64 for
float64 inputs), gradients come from the kernel's backward from merged statistics. Transfers
are posted before a step's compute and waited after it — the backward's dK/dV accumulator too,
as ring-flash-attn and InternEvo do — each kind on its own group (`RingChannels`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lcab.cp.base import accumulator_bytes, element_bytes
from lcab.cp.comm import PendingExchange, exchange, phase
from lcab.cp.plan import Plan
from lcab.cp.stages import Pricer, Transfer, Window
from lcab.distributed.groups import RingChannels
from lcab.kernels import PreparedAttention, Problem
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def merge_into(
    out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor
) -> None:
    """In place: (out, lse) ← merge((out, lse), (part, part_lse)); out (S, H, D), lse (H, S).

    Exact over disjoint key sets: o = e^(l1 - l) o1 + e^(l2 - l) o2, l = log(e^l1 + e^l2), here
    as ``out += w (part - out)`` with w = sigmoid(l2 - l1) (five tensor operations fewer).
    Rows that attended nothing carry l = -inf and weight 0: never NaN.
    """
    if part_lse.dtype != lse.dtype:
        part_lse = part_lse.to(lse.dtype)
    # rows still empty on both sides: -inf - -inf is NaN, their weight 0
    weight = torch.sigmoid(part_lse - lse).nan_to_num_(0.0)
    out.lerp_(part.to(out.dtype), weight.t().unsqueeze(-1))
    torch.logaddexp(lse, part_lse, out=lse)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Partial results and travelling gradients are kept in float32 (float64 for float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class Step:
    """One block of a ring schedule: whose keys, and the kernel bound to that sub-mask."""

    source: int
    """Ring position whose K/V this step uses."""
    prepared: PreparedAttention | None
    """None when the step's sub-mask is empty."""


def attend(
    step: Step, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of one step in packed layout."""
    p = step.prepared
    assert p is not None
    with phase("compute"):
        out, lse = p.run(p.to_native(q), p.to_native(k), p.to_native(v))
        assert lse is not None
        return p.from_native(out), lse


def attend_backward(
    step: Step,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one step in packed layout, under the merged (out, lse)."""
    p = step.prepared
    assert p is not None
    with phase("compute"):
        dq, dk, dv = p.backward(
            p.to_native(dout),
            p.to_native(q),
            p.to_native(k),
            p.to_native(v),
            p.to_native(out),
            lse,
        )
        return p.from_native(dq), p.from_native(dk), p.from_native(dv)


@dataclass
class RingSpec:
    """A ring schedule: global ranks in ring order, this rank's position, its steps.

    ``windows > 1``: LoongTrain's double ring of ``windows`` windows of ``size // windows``
    positions. Counted under ``{inner}_kv``, ``{inner}_kv_bwd``, ``{inner}_dkv`` inside a
    window, the same on ``outer`` between windows.
    """

    ranks: list[int]
    position: int
    channels: RingChannels
    steps: dict[int, Step]
    """Step of each source ring position."""
    windows: int = 1
    inner: str = "ring"
    outer: str = "ring_outer"

    @classmethod
    def of_steps(
        cls, ranks: list[int], position: int, channels: RingChannels, steps: list[Step], **kw: Any
    ) -> RingSpec:
        """A schedule from a list of steps (any order), keyed by their source position."""
        return cls(ranks, position, channels, {s.source: s for s in steps}, **kw)

    @functools.cached_property
    def size(self) -> int:
        """Ring size R."""
        return len(self.ranks)

    @functools.cached_property
    def window_size(self) -> int:
        """Ring positions per window."""
        return self.size // self.windows

    def _at(self, window: int, slot: int) -> int:
        return self.ranks[(window % self.windows) * self.window_size + slot % self.window_size]

    @functools.cached_property
    def window(self) -> int:
        """Window of this ring position."""
        return self.position // self.window_size

    @functools.cached_property
    def slot(self) -> int:
        """Position inside the window."""
        return self.position % self.window_size

    def source(self, outer: int, inner: int) -> int:
        """Ring position of the block held at outer step ``outer``, inner step ``inner``."""
        window = (self.window - outer) % self.windows
        return window * self.window_size + (self.slot - inner) % self.window_size

    def pass_inner(self, tensors: list[torch.Tensor], what: str) -> PendingExchange:
        """Send ``tensors`` to the next position of the window; receive the previous one's."""
        nxt, prev = self._at(self.window, self.slot + 1), self._at(self.window, self.slot - 1)
        group = self.channels.inner_dkv if what == "dkv" else self.channels.inner
        return exchange(tensors, nxt, prev, group, f"{self.inner}_{what}")

    def pass_outer(self, tensors: list[torch.Tensor], what: str) -> PendingExchange:
        """Send ``tensors`` to the same slot of the next window; receive the previous window's."""
        nxt, prev = self._at(self.window + 1, self.slot), self._at(self.window - 1, self.slot)
        group = self.channels.outer_dkv if what == "dkv" else self.channels.outer
        return exchange(tensors, nxt, prev, group, f"{self.outer}_{what}")


def _zeros_like(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape, dtype=accumulator_dtype(x.dtype), device=x.device)


@functools.cache
def ring_attention_function() -> type[torch.autograd.Function]:
    """`RingAttention`, made on first use (it needs torch, unused by the planner: `lcab.lazy`)."""

    class RingAttention(torch.autograd.Function):
        """Ring attention of local q against every rank's k/v (see module docstring)."""

        @staticmethod
        def forward(
            ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: RingSpec
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """(out, lse) of the local queries against every block of the ring."""
            out = _zeros_like(q)
            lse = torch.full(
                (q.shape[1], q.shape[0]), float("-inf"), dtype=out.dtype, device=q.device
            )
            window_kv = [k, v]
            s, w = ring.window_size, ring.windows
            for o in range(w):
                # the next window's block, fetched while the inner ring works
                prefetch = ring.pass_outer(window_kv, "kv") if o < w - 1 else None
                kv = window_kv
                for t in range(s):
                    pending = ring.pass_inner(kv, "kv") if t < s - 1 else None
                    step = ring.steps[ring.source(o, t)]
                    if step.prepared is not None:
                        part, part_lse = attend(step, q, kv[0], kv[1])
                        with phase("compute"):
                            merge_into(out, lse, part, part_lse)
                    if pending is not None:
                        kv = pending.wait()
                if prefetch is not None:
                    window_kv = prefetch.wait()
            result = out.to(q.dtype)
            ctx.save_for_backward(q, k, v, result, lse)
            ctx.ring = ring
            ctx.mark_non_differentiable(lse)
            return result, lse

        @staticmethod
        def backward(
            ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
            """(dq, dk, dv): blocks travel again, each dK/dV accumulator following its block.

            The block in hand's accumulator arrives while this step's kernel runs, is waited
            for after it, gets this step's dK/dV and is posted on without waiting. Only the hop
            that ends a window (its own block's accumulator, which must be home) waits at once.
            """
            q, k, v, out, lse = ctx.saved_tensors
            ring: RingSpec = ctx.ring
            s, w = ring.window_size, ring.windows
            dq = _zeros_like(q)
            window_kv = [k, v]
            # dK/dV of the block in hand, travelling with it (fresh buffers: updated in place)
            acc = [_zeros_like(k), _zeros_like(v)]
            incoming: PendingExchange | None = None  # the next block's accumulator, posted
            for o in range(w):
                prefetch = ring.pass_outer(window_kv, "kv_bwd") if o < w - 1 else None
                kv = window_kv
                for t in range(s):
                    pending = ring.pass_inner(kv, "kv_bwd") if t < s - 1 else None
                    step = ring.steps[ring.source(o, t)]
                    grads = None
                    if step.prepared is not None:
                        grads = attend_backward(step, dout, q, kv[0], kv[1], out, lse)
                        dq += grads[0]
                    if incoming is not None:  # waited only now: the kernel ran meanwhile
                        acc = incoming.wait()
                        incoming = None
                    if grads is not None:
                        acc[0] += grads[1]
                        acc[1] += grads[2]
                    if s > 1:  # the accumulator follows its block one inner hop behind
                        incoming = ring.pass_inner(acc, "dkv")
                    if pending is not None:
                        kv = pending.wait()
                if w > 1:
                    # the window's own block's accumulator is home: it goes on to the next window
                    # with its block (the gradient synchronisation at each outer step)
                    if incoming is not None:
                        acc = incoming.wait()
                    incoming = ring.pass_outer(acc, "dkv")
                if prefetch is not None:
                    window_kv = prefetch.wait()
            if incoming is not None:
                acc = incoming.wait()
            return dq.to(q.dtype), acc[0].to(k.dtype), acc[1].to(v.dtype), None

    return RingAttention


def ring_bytes(plan: Plan, problem: Problem, inner: str, outer: str) -> dict[str, int]:
    """K/V and dK/dV bytes one rank sends around the plan's ring of windows (fwd + bwd).

    In each pass a block makes s - 1 hops inside each of the w windows of s positions and
    w - 1 between them; its accumulator one hop more of each (it returns to its owner).
    """
    w = plan.windows
    s = plan.ring // w
    block = plan.ring_block(problem.head_dim)
    kv, acc = block * element_bytes(problem), block * accumulator_bytes(problem)
    pairs = {
        f"{outer}_kv": (w - 1) * kv,
        f"{inner}_kv": w * (s - 1) * kv,
        f"{outer}_kv_bwd": (w - 1) * kv,
        f"{inner}_kv_bwd": w * (s - 1) * kv,
        f"{inner}_dkv": w * s * acc if s > 1 else 0,
        f"{outer}_dkv": w * acc if w > 1 else 0,
    }
    return {k: v for k, v in pairs.items() if v}


def ring_buffers(plan: Plan, problem: Problem, backward: bool) -> dict[str, float]:
    """Bytes a ring position holds besides its shards (`Strategy.buffers`).

    The K/V blocks in flight (in hand, arriving, and a double ring's prefetched block), the
    float32 merged output and, in the backward, the travelling dK/dV and the dQ accumulator.
    """
    tokens, heads, d = plan.shard_len * plan.ulysses, plan.heads, problem.head_dim
    block, acc = plan.ring_block(d), accumulator_bytes(problem)
    terms = {
        "k, v blocks in flight": (2 + (plan.windows > 1)) * block * element_bytes(problem),
        "merged out, lse (fp32)": float(tokens * heads.local_q * (d + 1) * acc),
    }
    if backward:
        terms["travelling dk, dv (fp32)"] = 2 * block * acc
        terms["dq accumulator (fp32)"] = tokens * heads.local_q * d * acc
    return terms


def ring_schedule(
    plan: Plan, problem: Problem, rank: int, bwd: bool, price: Pricer, inner: str, outer: str
) -> list[Window]:
    """What `RingAttention` does on ``rank`` in one pass (`lcab.cp.stages`).

    As `RingAttention` runs it; where the implementation waits for a window's home hop at
    once (`Implementation.home_hop`); the next window's K/V travel behind a whole window.
    """
    grid = plan.grid(rank)
    ring, p, member = grid.my_ring(), grid.ring_index, grid.ulysses_index
    w = plan.windows
    s = plan.ring // w
    window, slot = divmod(p, s)
    links, impl = price.links, price.impl
    block = plan.ring_block(problem.head_dim)
    kv = block * element_bytes(problem)
    acc = block * (
        accumulator_bytes(problem) if impl.dkv_in_accumulator else element_bytes(problem)
    )
    nxt, later = ring[window * s + (slot + 1) % s], ring[((window + 1) % w) * s + slot]
    tail = "_bwd" if bwd else ""
    next_kv = (links.p2p(f"{inner}_kv{tail}", kv, rank, nxt, s),)
    dkv = (links.p2p(f"{inner}_dkv", acc, rank, nxt, s),)
    home = impl.home_hop is None or plan.strategy in impl.home_hop
    windows, sources = [], []
    carried: tuple[Transfer, ...] = ()  # an accumulator travelling into the next window
    for o in range(w):
        stages = []
        for t in range(s):
            source = ((window - o) % w) * s + (slot - t) % s
            sources.append(source)
            work, finish = price.call("ring", p, source, member, bwd)
            during: tuple[Transfer, ...] = next_kv if t < s - 1 else ()
            during += (dkv if bwd and t > 0 else ()) + (carried if t == 0 else ())
            stages.append(links.stage(work, during, (), finish))
        carried = ()
        if bwd and s > 1 and home:  # one more inner hop, waited at once
            stages.append(links.stage(None, (), dkv))
        if bwd and w > 1:  # the window's accumulator moves on to the next window
            outer_dkv = (links.p2p(f"{outer}_dkv", acc, rank, later, w),)
            if o < w - 1:
                carried = outer_dkv
            else:
                stages.append(links.stage(None, (), outer_dkv))
        prefetch = (links.p2p(f"{outer}_kv{tail}", kv, rank, later, w),) if o < w - 1 else ()
        windows.append(Window(tuple(stages), prefetch))
    merge = price.merge(p, sources, bwd)
    return windows + ([Window((links.stage(merge),))] if merge is not None else [])
