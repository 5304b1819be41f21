"""Price a strategy's own schedule, rank by rank and step by step, as work and transfers.

The planner knows no strategy by name: it takes the plan the runner would execute
(`Strategy.plan`) and the schedule the strategy states (`Strategy.schedule`, `lcab.cp.stages`),
and prices each call by the exact attended area of its row and key sets (`lcab.plan.areas`)
and the copies the implementation makes around it (`lcab.plan.harness`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lcab.cp.allgather import zigzag_halves as zigzag_halves  # the published halves, re-exported
from lcab.cp.base import Plan, Strategy, element_bytes
from lcab.cp.stages import Links, Stage, Transfer, Window
from lcab.flops import PASS_FACTORS
from lcab.kernels import Problem
from lcab.masks.core import AttnMask
from lcab.plan.areas import pair_work
from lcab.plan.calls import (
    Call,
    CallWorks,
    causal_half,
    copies_work,
    documents_of,
    merge_work,
    ring_calls_halves,
)
from lcab.plan.harness import LCAB, Elements, Harness
from lcab.plan.steps import Work


@dataclass
class Replay:
    """Every rank's windows per pass ("fwd", "bwd"); ranks share the structure (lockstep)."""

    plan: Plan
    problem: Problem
    devices_per_node: int
    harness: Harness = LCAB
    passes: dict[str, list[tuple[Window, ...]]] = field(default_factory=dict)
    global_flops: dict[str, float] = field(default_factory=dict)

    def transfers(self, rank: int, pass_: str) -> list[Transfer]:
        """Every transfer of ``rank`` in ``pass_``."""
        out: list[Transfer] = []
        for window in self.passes[pass_][rank]:
            out += window.background
            for stage in window.stages:
                out += stage.during + stage.after
        return out

    def bytes_by_op(self, rank: int) -> dict[str, int]:
        """Bytes ``rank`` sends per operation over forward + backward (the plan's accounting)."""
        total: Counter[str] = Counter()
        for pass_ in self.passes:
            for t in self.transfers(rank, pass_):
                total[t.op] += t.nbytes
        return dict(total)

    def work(self, rank: int, pass_: str) -> list[Work]:
        """The attention kernel calls of ``rank`` in ``pass_``, in order.

        Not the matrix products a harness adds (`Work.matmul_flops`).
        """
        windows = self.passes[pass_][rank]
        return [work for w in windows for s in w.stages for work in s.calls if work.flops]


def replay(
    strategy: Strategy,
    mask: AttnMask,
    problem: Problem,
    world: int,
    plan: Plan | None = None,
    harness: Harness = LCAB,
    diagonal: bool = True,
) -> Replay:
    """The priced schedule of ``strategy`` running ``mask`` on ``world`` ranks (fwd and bwd).

    ``harness``: whose implementation of the schedule (default: lcab's runner).
    ``diagonal=False`` leaves the calls' band-edge rows uncounted (`Work.diagonal_rows` 0):
    only a kernel that masks whole pieces afterwards (``KernelRate.diagonal_rows``, lcab's
    `ranges`) is costed by them, and counting them was 40 % of a GPU planner sweep's time.
    """
    plan = plan or strategy.plan(mask, problem, world)
    dpn = strategy.devices_per_node
    out = Replay(plan, problem, dpn, harness)
    forward = 4 * mask.area() * (problem.heads_q // mask.num_heads) * problem.head_dim
    for pass_ in ("fwd", "bwd"):
        num, den = PASS_FACTORS[pass_]
        out.global_flops[pass_] = forward * num / den
    price = _Pricer(strategy, plan, mask, problem, harness, diagonal)
    tail = _projection_gradients(plan, problem, harness)
    out.passes = {
        "fwd": [tuple(strategy.schedule(plan, problem, r, False, price)) for r in range(world)],
        "bwd": [(*strategy.schedule(plan, problem, r, True, price), *tail) for r in range(world)],
    }
    return out


class _Pricer:
    """The calls of one replay as `Work` (`lcab.cp.stages.Pricer`), each distinct one once."""

    def __init__(
        self,
        strategy: Strategy,
        plan: Plan,
        mask: AttnMask,
        problem: Problem,
        harness: Harness,
        diagonal: bool,
    ) -> None:
        self.plan, self.problem, self.impl = plan, problem, harness
        self.links = Links(strategy.devices_per_node, harness.p2p_batched)
        self.rows, self.keys = strategy.block_sets(plan, mask, harness)
        works = pair_work(mask, self.rows, self.keys, diagonal=diagonal)
        self.works = CallWorks(works, plan, problem)
        self.halves = ring_calls_halves(harness, plan.placement.balancer, mask)
        self.documents = documents_of(mask)
        self._calls: dict[tuple[str, int, int, str], Call] = {}

    def _call(self, family: str, rows: int, keys: int) -> Call:
        """The call of ``family`` on pair (rows, keys): its tokens, the half it extracts."""
        half = causal_half(rows, keys) if self.halves and family == "ring" else ""
        q_tokens = len(self.rows[rows]) // (2 if half == "q" else 1)
        kv_tokens = len(self.keys[keys]) // (2 if half == "kv" else 1)
        key = (family, q_tokens, kv_tokens, half)
        call = self._calls.get(key)
        if call is None:
            call = Call(family, self.impl, q_tokens, kv_tokens, self.documents, half)
            call = self._calls[key] = call
        return call

    def call(
        self, family: str, rows: int, keys: int, member: int, bwd: bool
    ) -> tuple[Work | None, tuple[Work, ...]]:
        per = self.works.per_call(self._call(family, rows, keys), bwd)
        return self.works.step(per, member, rows, keys)

    def copies(self, what: str, bwd: bool, q_tokens: int, kv_tokens: int) -> Work | None:
        passes = self.impl.passes_of(what, bwd)
        if passes is None:
            return None
        d, heads = self.problem.head_dim, self.plan.heads
        elements = Elements(q_tokens * heads.local_q * d, kv_tokens * heads.local_kv * d, 0, 0)
        return copies_work(passes, elements, self.problem)

    def merge(self, rows: int, keys: list[int], bwd: bool) -> Any:
        calls = [self._call("ring", rows, k) for k in keys]
        return merge_work(calls, self.plan, self.problem, self.impl, bwd)


def _projection_gradients(plan: Plan, problem: Problem, harness: Harness) -> tuple[Window, ...]:
    """The backward's last window when the timed region includes the Q/K/V projections."""
    flops, traffic = harness.projection_costs(
        plan.shard_len, problem.heads_q, problem.heads_kv, problem.head_dim, element_bytes(problem)
    )
    if not flops:
        return ()
    return (Window((Stage(Work(0.0, 0.0, memory_bytes=traffic, matmul_flops=flops)),)),)
