"""`CPTarget`: a context-parallel cell as the runner sees it (one per rank).

It joins the process group, checks what the strategy and kernel need, builds this rank's part of
the plan for each mask, synchronises repetitions (barrier; per-repetition times reduced to the
slowest rank) and, once per length, measures one call's communication (bytes per operation,
max over ranks, next to the analytic volume) and its time split into compute, communication
and waiting.
"""

from __future__ import annotations

import time

import torch

from lcab.cell import Cell
from lcab.cp.base import STRATEGIES, Plan, Strategy
from lcab.cp.comm import STATS, gather_floats, max_over_ranks
from lcab.cp.prepared import CPPrepared
from lcab.distributed.context import DistContext
from lcab.kernels import Kernel, PreparedAttention, Problem, get_kernel
from lcab.masks.core import AttnMask
from lcab.records.schema import RunRecord

_BACKWARD_OPS = ("_grad", "_bwd", "dkv")


def is_backward_op(name: str) -> bool:
    """Whether a communication operation belongs to the backward pass."""
    return any(tag in name for tag in _BACKWARD_OPS)


def cp_reasons(
    strategy: Strategy,
    kernel: Kernel,
    problem: Problem,
    mask: AttnMask | None,
    world: int,
    pass_: str,
) -> list[str]:
    """Why ``strategy`` with local ``kernel`` cannot run ``pass_`` on ``world`` ranks (pure).

    The kernel is checked on the *local* problem each rank runs (its share of the heads after
    the Ulysses split, at least one KV head since heads are replicated when the degree exceeds
    them), plus what the strategy needs from it (LSE, stats backward, per-head masks). The
    support matrix calls this without any process group.
    """
    reasons = strategy.reasons(problem, world)
    if reasons:
        return reasons
    ulysses = strategy.ulysses_degree(world)
    local = Problem(
        max(problem.seqlen_q // world, 1) * ulysses,
        max(problem.seqlen_k // world, 1) * ulysses,
        problem.heads_q // ulysses,
        max(problem.heads_kv // ulysses, 1),
        problem.head_dim,
        problem.dtype,
        problem.device,
    )
    kernel_why = [
        r
        for r in kernel.not_supported_reasons(local, None, pass_)
        if not r.startswith("no GQA")  # replication may turn GQA into MHA locally
    ]
    reasons += [f"kernel {kernel.name}: {r}" for r in kernel_why]
    reasons += strategy.kernel_reasons(kernel, problem, pass_)
    if mask is not None and mask.num_heads > 1 and not kernel.caps.per_head_masks:
        reasons.append(f"kernel {kernel.name} takes no per-KV-head masks")
    return reasons


class CPTarget:
    """A strategy around a kernel, on one rank of a live process group."""

    def __init__(self, cell: Cell, ctx: DistContext) -> None:
        self.ctx = ctx
        self.rank, self.world = ctx.rank, ctx.world
        self.strategy = STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)
        self.kernel = get_kernel(cell.kernel, **cell.kernel_options)
        self.plan: Plan | None = None

    def reasons(self, problem: Problem, mask: AttnMask | None, pass_: str) -> list[str]:  # noqa: D102
        return cp_reasons(self.strategy, self.kernel, problem, mask, self.world, pass_)

    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:  # noqa: D102
        self.plan = self.strategy.plan(mask, problem, self.world)
        return self.strategy.build(self.plan, mask, problem, self.kernel, self.ctx)

    def barrier(self) -> None:  # noqa: D102
        self.ctx.barrier()

    def reduce_times(self, times: list[float]) -> list[float]:  # noqa: D102
        return max_over_ranks(times)

    def gather(self, value: float) -> list[float]:
        """Every rank's ``value`` (rank order)."""
        return gather_floats(value)

    def extra_record_fields(self, record: RunRecord, mask: AttnMask) -> None:  # noqa: D102
        return None

    def _split(self, pass_: str, total_s: float) -> dict[str, float]:
        """The slowest rank's split of one pass: total, compute, comm, wait, other (ms).

        Taken from one rank (the one with the longest pass) so the parts add up to its total;
        ``other`` is time outside the phases (merging, layout changes, Python).
        """
        parts = {name: STATS.seconds.get(name, 0.0) for name in ("compute", "comm", "wait")}
        STATS.seconds.clear()
        totals = self.gather(total_s)
        slowest = max(range(len(totals)), key=totals.__getitem__)
        split = {"total": total_s, **parts}
        split = {name: self.gather(value)[slowest] * 1e3 for name, value in split.items()}
        split["other"] = split["total"] - split["compute"] - split["comm"] - split["wait"]
        return {f"{pass_}_{name}": value for name, value in split.items()}

    def describe(
        self,
        record: RunRecord,
        prepared: PreparedAttention,
        native: dict[str, torch.Tensor],
        backward: bool,
    ) -> None:
        """One untimed forward(+backward): measured bytes per operation and the time split."""
        plan = self.plan
        assert plan is not None
        STATS.reset()
        leaves = [native[n].detach().clone().requires_grad_(backward) for n in ("q", "k", "v")]
        phases: dict[str, float] = {}
        self.ctx.barrier()  # every rank starts together, so waits are the strategy's own
        start = time.perf_counter()
        out, _ = prepared.run(*leaves)
        phases |= self._split("fwd", time.perf_counter() - start)
        if backward:
            self.ctx.barrier()
            start = time.perf_counter()
            out.backward(native["dout"])
            phases |= self._split("bwd", time.perf_counter() - start)
        measured = {
            op: max_over_ranks([float(STATS.bytes_sent.get(op, 0))])[0]
            for op in sorted(plan.comm_bytes)
        }
        analytic = {
            op: b for op, b in plan.comm_bytes.items() if backward or not is_backward_op(op)
        }
        record.comm_bytes_analytic = int(sum(analytic.values()))
        record.comm_bytes_measured = int(sum(v for op, v in measured.items() if op in analytic))
        record.comm_bytes_by_op = {op: [int(measured[op]), analytic[op]] for op in analytic}
        record.phase_ms = phases
        assert isinstance(prepared, CPPrepared)
        record.balance_imbalance = plan.imbalance(prepared.mask)
        record.padding_tokens = plan.padding_tokens
        record.kv_replication = plan.heads.kv_replication
        record.cp_params = {
            **record.cp_params,
            "ulysses_degree": plan.ulysses,
            "ring_degree": plan.ring,
            "windows": plan.windows,
            "balancer": plan.balancer,
            "shard_len": plan.shard_len,
        }

    def close(self) -> None:
        """Leave the process group."""
        self.ctx.close()


def cp_target(cell: Cell, rank: int, rendezvous: str | None) -> CPTarget:
    """Join the world of ``cell`` as ``rank`` and return its target."""
    if rendezvous is None:
        ctx = DistContext.from_environment(
            cell.backend, float(cell.bench["timeout_s"]), cell.device
        )
    else:
        ctx = DistContext.start_local(
            rank,
            cell.world_size,
            cell.devices_per_node,
            cell.backend,
            rendezvous,
            float(cell.bench["timeout_s"]),
            cell.device,
        )
    return CPTarget(cell, ctx)
