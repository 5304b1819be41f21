"""What the runner runs a cell on: a `Target` — the kernel itself, or a CP strategy around it.

`CPTarget` is one rank of a CP cell: it joins the process group, builds this rank's part of the
plan, synchronises repetitions and measures one call's communication bytes and phase split. The
runner sees only the protocol, and `pass_callable` gives it each pass's timed call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

from typing_extensions import override

from lcab.bench.inputs import NAMES, SeededInputs
from lcab.bench.memory import MemoryReading
from lcab.bench.numerics import Collector, LocalCollector
from lcab.cell import Cell
from lcab.cp.base import STRATEGIES, Plan
from lcab.cp.comm import (
    STATS,
    broadcast_floats,
    gather_floats,
    gather_strings,
    is_backward_op,
    max_over_ranks,
    phase,
    phase_clock,
)
from lcab.cp.prepared import CPPrepared
from lcab.distributed.context import DistContext, node_name
from lcab.kernels import Kernel, PreparedAttention, Problem, get_kernel
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.records.schema import RunRecord

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


class PassCall(NamedTuple):
    """One pass as the timer calls it, with the untimed hook resetting its leaves' gradients."""

    fn: Callable[[], object]
    before_each: Callable[[], None] | None
    leaves: list[torch.Tensor]


def pass_callable(
    pass_: str, prepared: PreparedAttention, native: dict[str, torch.Tensor]
) -> PassCall:
    """The timed call of one pass, with its untimed before-each hook."""
    q, k, v, dout = native["q"], native["k"], native["v"], native["dout"]
    if pass_ == "fwd":
        return PassCall(lambda: prepared.run(q, k, v), None, [])
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def zero() -> None:
        for t in leaves:
            t.grad = None

    if pass_ == "bwd":
        out, _ = prepared.run(*leaves)
        return PassCall(lambda: out.backward(dout, retain_graph=True), zero, leaves)

    def fwd_bwd() -> None:
        prepared.run(*leaves)[0].backward(dout)

    return PassCall(fwd_bwd, zero, leaves)


class Target(Protocol):
    """What runs the attention: a kernel, or a CP strategy around one (defaults: one device)."""

    rank: int
    world: int

    def reasons(self, problem: Problem, mask: AttnMask | None, pass_: str) -> list[str]:
        """Why ``pass_`` cannot run (empty: it can)."""

    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        """Setup for one mask (timed as setup)."""

    def barrier(self) -> None:
        """Synchronise ranks before a repetition (no-op on one device)."""
        return None

    def inputs(self, prepared: PreparedAttention, source: SeededInputs) -> dict[str, torch.Tensor]:
        """The q, k, v, dout this rank holds, in the prepared call's native layout."""

    def collector(self, prepared: PreparedAttention) -> Collector:
        """How numerics checks bring results to the checking rank."""

    def share(self, values: list[float]) -> list[float]:
        """Rank 0's ``values`` on every rank: one decision all ranks follow."""
        return list(values)

    def largest_reading(self, reading: MemoryReading) -> MemoryReading:
        """The reading of the rank with the largest peak (delta, reserved: largest of any rank)."""
        return reading

    def reduce_times(self, times: list[float]) -> list[float]:
        """Per-repetition times as the slowest rank saw them."""
        return times

    def gather(self, value: float) -> list[float]:
        """Every rank's ``value`` (rank order)."""
        return [value]

    def describe(
        self,
        record: RunRecord,
        prepared: PreparedAttention,
        native: dict[str, torch.Tensor],
        backward: bool,
    ) -> None:
        """Distributed fields (comm bytes, phases, balance) from one untimed call."""
        return None

    def close(self) -> None:
        """Release what the target holds (a process group)."""
        return None


@dataclass
class KernelTarget(Target):
    """A single-device target: the kernel itself."""

    kernel: Kernel
    rank: int = 0
    world: int = 1

    @override
    def reasons(self, problem: Problem, mask: AttnMask | None, pass_: str) -> list[str]:
        return self.kernel.not_supported_reasons(problem, mask, pass_)

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return self.kernel.prepare(mask, problem)

    @override
    def inputs(self, prepared: PreparedAttention, source: SeededInputs) -> dict[str, torch.Tensor]:
        return {n: prepared.to_native(source.whole(n)) for n in NAMES}

    @override
    def collector(self, prepared: PreparedAttention) -> Collector:
        return LocalCollector(prepared)


class CPTarget(Target):
    """A strategy around a kernel, on one rank of a live process group."""

    def __init__(self, cell: Cell, dist: DistContext) -> None:
        self.dist = dist
        self.rank, self.world = dist.rank, dist.world
        self.hosts = gather_strings(node_name())
        """Each rank's host, as the ranks report it (records say where every rank ran)."""
        why = node_major_problem(self.hosts, cell.devices_per_node)
        if why is not None:  # every rank holds the same list, so every rank stops here
            raise RuntimeError(why)
        self.strategy = STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)
        self.kernel = get_kernel(cell.kernel, **cell.kernel_options)
        self.plan: Plan | None = None

    @override
    def reasons(self, problem: Problem, mask: AttnMask | None, pass_: str) -> list[str]:
        """Why any rank cannot run ``pass_``: collective, so no rank skips what its peers enter.

        A reason only some ranks give names them.
        """
        mine = self.strategy.not_supported_reasons(self.kernel, problem, mask, self.world, pass_)
        every = [json.loads(text) for text in gather_strings(json.dumps(mine))]
        merged: list[str] = []
        for reason in dict.fromkeys(r for reasons in every for r in reasons):
            ranks = [rank for rank, reasons in enumerate(every) if reason in reasons]
            label = "" if len(ranks) == len(every) else f"rank {_ranks_text(ranks)}: "
            merged.append(label + reason)
        return merged

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        self.plan = self.strategy.plan(mask, problem, self.world)
        return self.strategy.build(self.plan, mask, problem, self.kernel, self.dist)

    @override
    def barrier(self) -> None:
        self.dist.barrier()

    @override
    def inputs(self, prepared: PreparedAttention, source: SeededInputs) -> dict[str, torch.Tensor]:
        """Only this rank's shard of each tensor, drawn from the seed (never the global one)."""
        assert isinstance(prepared, CPPrepared)
        return {n: source.shard(n, prepared.tokens) for n in NAMES}

    @override
    def collector(self, prepared: PreparedAttention) -> Collector:
        assert isinstance(prepared, CPPrepared)
        return prepared

    @override
    def share(self, values: list[float]) -> list[float]:
        return broadcast_floats(values)

    @override
    def largest_reading(self, reading: MemoryReading) -> MemoryReading:
        """Collective: the largest peak's rank (delta and reserved: any rank's largest each)."""
        peaks = self.gather(float(reading.peak_bytes))
        baselines = self.gather(float(reading.baseline_bytes))
        reserved = self.gather(
            float(-1 if reading.reserved_bytes is None else reading.reserved_bytes)
        )
        top = max(range(len(peaks)), key=peaks.__getitem__)
        return replace(
            reading,
            peak_bytes=int(peaks[top]),
            baseline_bytes=int(baselines[top]),
            reserved_bytes=None if max(reserved) < 0 else int(max(reserved)),
            rank=top,
            largest_delta_bytes=int(max(p - b for p, b in zip(peaks, baselines, strict=True))),
        )

    @override
    def reduce_times(self, times: list[float]) -> list[float]:
        return max_over_ranks(times)

    @override
    def gather(self, value: float) -> list[float]:
        return gather_floats(value)

    def _split(self, pass_: str) -> dict[str, float]:
        """The slowest rank's split of one pass (ms); ``other`` is time outside the phases."""
        parts = {name: STATS.seconds.get(name, 0.0) for name in ("compute", "comm", "wait")}
        total_s = STATS.seconds.get("total", 0.0)
        STATS.seconds.clear()
        totals = self.gather(total_s)
        slowest = max(range(len(totals)), key=totals.__getitem__)
        split = {"total": total_s, **parts}
        split = {name: self.gather(value)[slowest] * 1e3 for name, value in split.items()}
        split["other"] = split["total"] - split["compute"] - split["comm"] - split["wait"]
        return {f"{pass_}_{name}": value for name, value in split.items()}

    @override
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
        device = self.dist.device
        self.dist.barrier()  # every rank starts together, so waits are the strategy's own
        # each pass read once, after one synchronize at the end of its block
        with phase_clock(device), phase("total"):
            out, _ = prepared.run(*leaves)
        phases |= self._split("fwd")
        if backward:
            self.dist.barrier()
            with phase_clock(device), phase("total"):
                out.backward(native["dout"])
            phases |= self._split("bwd")
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
        record.rank_hosts = list(self.hosts)
        record.shared_device = self.dist.shared_device
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

    @override
    def close(self) -> None:
        """Leave the process group."""
        self.dist.close()


def node_major_problem(hosts: list[str], devices_per_node: int) -> str | None:
    """Why ranks are not numbered node-major, as Ulysses groups need (None: they are)."""
    for first in range(0, len(hosts), devices_per_node):
        block = hosts[first : first + devices_per_node]
        if len(set(block)) > 1:
            return (
                f"ranks {first}..{first + len(block) - 1} run on {', '.join(sorted(set(block)))}: "
                f"lcab numbers ranks node-major ({devices_per_node} consecutive ranks per node); "
                "launch with srun --distribution=block (SLURM's default), not cyclic"
            )
    return None


def _ranks_text(ranks: list[int]) -> str:
    """``3`` or ``3, 5`` (at most 8 named, then a count)."""
    head = ", ".join(str(r) for r in ranks[:8])
    return head if len(ranks) <= 8 else f"{head} (+{len(ranks) - 8} more)"


def make_target(cell: Cell, rank: int, rendezvous: str | None) -> Target:
    """The target of ``cell`` on ``rank``; CP joins at ``rendezvous``, else from the environment."""
    if cell.cp == "none":
        return KernelTarget(get_kernel(cell.kernel, **cell.kernel_options))
    high_priority = bool(cell.config.get("topology", {}).get("nccl_high_priority", False))
    if rendezvous is None:
        dist = DistContext.from_environment(
            cell.backend, cell.bench.timeout_s, cell.device, high_priority
        )
    else:
        dist = DistContext.start_local(
            rank,
            cell.world_size,
            cell.devices_per_node,
            cell.backend,
            rendezvous,
            cell.bench.timeout_s,
            cell.device,
            high_priority,
        )
    return CPTarget(cell, dist)
