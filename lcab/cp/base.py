"""The context-parallel strategy contract and its plan.

`Strategy.plan` is pure data from the mask alone (who holds which tokens, how heads split, the
analytic communication), read by tests, the balance report and the planner without running
anything; `Strategy.build` turns it into this rank's callable (`CPPrepared`) with any kernel the
strategy can use. Ranks are node-major; rank = ring_index · U + ulysses_index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from lcab.cell import dtype_bytes
from lcab.cp.balance import Placement, place
from lcab.cp.plan import HeadSplit, Plan, head_split
from lcab.cp.prepared import CPPrepared
from lcab.cp.stages import RUNNER, Implementation, Pricer, Window
from lcab.distributed.context import DistContext
from lcab.kernels import Kernel, Problem
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray
from lcab.masks.remap import remap, select_heads
from lcab.registry import Registry


def plan_layouts(
    mask: AttnMask, world: int, ulysses: int, balancer: str
) -> tuple[Placement, tuple[IntArray, ...]]:
    """Ring shards placed by ``balancer``, each split contiguously among its Ulysses members."""
    ring = world // ulysses
    placement = place(mask, ring, balancer, multiple=ulysses)
    return placement, placement.split(ulysses).layouts


BLOCK_STAND_IN: list[Callable[[IntArray, IntArray, HeadSplit | None, int], AttnMask] | None] = [
    None
]
"""Set by the schedule check (`lcab.cp.schedule_check`) while it records: a sub-mask with work
exactly where `step_mask`'s has, without restricting the mask (~1 ms a block, 9,216 blocks a
96-rank ring); its kernel never reads it."""


def step_mask(
    mask: AttnMask, rows: IntArray, cols: IntArray, heads: HeadSplit | None, ulysses_index: int = 0
) -> AttnMask:
    """The mask a step computes: rows x cols of ``mask``, with this rank's mask heads."""
    if BLOCK_STAND_IN[0] is not None:  # the schedule check: only whether the block has work
        return BLOCK_STAND_IN[0](rows, cols, heads, ulysses_index)
    sub = remap(mask, rows, cols)
    if mask.num_heads > 1 and heads is not None:
        sub = select_heads(sub, heads.kv_heads_of(ulysses_index))
    return sub


BLOCK_CLOSED_LOWERINGS = frozenset({"dense", "ranges", "flex", "ffa"})
"""Lowerings that take every rectangle of a one-head mask they take whole (slices stay slices,
BlockMasks and dense masks are per element). Not block tables: a kernel that computes whole
tiles takes a mask only when its touched tiles are full, and a block's offset can cut them (on
an H100 a Flex whole-tile kernel ran every strategy's causal blocks and got them wrong)."""


@dataclass
class StrategyOptions:
    """Options every strategy takes (its config group ``cp`` is generated from these)."""

    balance: str = "zigzag"
    """Token placement over ranks: contiguous | zigzag (the paper's) | area (mask-aware)."""


class Strategy(ABC):
    """A registered context-parallel strategy."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    merges_partials: ClassVar[bool] = True
    """Whether partial results are merged by LSE (needs a kernel with LSE and stats backward)."""
    options_cls: ClassVar[type] = StrategyOptions
    """The strategy's options as a dataclass: the schema of ``conf/cp/<name>.yaml``."""

    def __init__(self, options: dict[str, Any], devices_per_node: int) -> None:
        self.options = dict(options)
        self.devices_per_node = devices_per_node
        self.balancer = str(self.options.get("balance", "zigzag"))
        self._last_blocks: tuple[Kernel, AttnMask, Problem, int, list[str]] | None = None

    def ulysses_degree(self, world: int) -> int:
        """Ulysses group size for ``world`` ranks (1 for pure rings, ``world`` for Ulysses)."""
        return 1

    def windows(self, ring: int) -> int:
        """Windows of the double ring (1: a plain ring)."""
        return 1

    def reasons(self, problem: Problem, world: int) -> list[str]:
        """Why this strategy cannot run ``problem`` on ``world`` ranks (empty: it can)."""
        reasons = []
        ulysses = self.ulysses_degree(world)
        if ulysses < 1 or world % ulysses:
            reasons.append(f"Ulysses degree {ulysses} does not divide the {world} ranks")
            return reasons
        _, why = head_split(problem.heads_q, problem.heads_kv, ulysses)
        if why:
            reasons.append(why)
        return reasons

    def kernel_reasons(self, kernel: Kernel, problem: Problem, pass_: str) -> list[str]:
        """What the strategy needs from the kernel beyond running the local problem."""
        reasons = []
        if self.merges_partials:
            if not kernel.returns_lse(problem.device_type):
                reasons.append(
                    f"{self.name} merges partial results by log-sum-exp, and kernel "
                    f"{kernel.name!r} returns none on {problem.device_type}"
                )
            missing = kernel.stats_backward_reasons(problem) if pass_ != "fwd" else []
            if missing:
                reasons.append(
                    f"{self.name}'s backward needs the kernel's backward from merged softmax "
                    f"statistics: {'; '.join(missing)}"
                )
        return reasons

    def not_supported_reasons(
        self,
        kernel: Kernel,
        problem: Problem,
        mask: AttnMask | None,
        world: int,
        pass_: str,
    ) -> list[str]:
        """Why this strategy with local ``kernel`` cannot run ``pass_`` on ``world`` ranks (pure).

        The kernel is checked on the *local* problem each rank runs (`local_problem`), plus
        what the strategy needs from it (LSE, stats backward, per-head masks).
        """
        reasons = self.reasons(problem, world)
        if reasons:
            return reasons
        ulysses = self.ulysses_degree(world)
        local = self._local_problem(problem, world, ulysses)
        kernel_why = kernel.not_supported_reasons(local, None, pass_)
        reasons += [f"kernel {kernel.name}: {r}" for r in kernel_why]
        reasons += self.kernel_reasons(kernel, problem, pass_)
        if mask is not None and mask.num_heads > 1 and not kernel.caps.per_head_masks:
            reasons.append(f"kernel {kernel.name} takes no per-KV-head masks")
        # the plan exists (reasons() is empty); per-KV-head masks too, where the kernel takes them
        if mask is not None and (mask.num_heads == 1 or kernel.caps.per_head_masks):
            reasons += self.block_reasons(kernel, mask, problem, world)
        return reasons

    @staticmethod
    def _local_problem(
        problem: Problem, world: int, ulysses: int, seqlens: tuple[int, int] | None = None
    ) -> Problem:
        """The problem one rank's kernel call sees (tokens: its share, or ``seqlens``).

        Its heads are those the Ulysses split leaves it, K/V heads replicated as `head_split`
        does: GQA stays GQA unless the replication makes it MHA.
        """
        split, _ = head_split(problem.heads_q, problem.heads_kv, ulysses)
        heads_q = split.local_q if split else problem.heads_q // ulysses
        heads_kv = split.local_kv if split else max(problem.heads_kv // ulysses, 1)
        rows, keys = seqlens or (
            max(problem.seqlen_q // world, 1) * ulysses,
            max(problem.seqlen_k // world, 1) * ulysses,
        )
        return Problem(
            rows, keys, heads_q, heads_kv, problem.head_dim, problem.dtype, problem.device
        )

    @classmethod
    def block_sets(
        cls, plan: Plan, mask: AttnMask, impl: Implementation = RUNNER
    ) -> tuple[list[IntArray], list[IntArray]]:
        """(row sets, key sets) whose pairs the kernel calls compute (`schedule` names them).

        Rings (and Ulysses, a ring of one) call the kernel with one ring shard's rows against
        each ring shard's keys; strategies that call it otherwise override this.
        """
        shards = list(plan.placement.layouts)
        return shards, shards

    @classmethod
    def blocks(cls, plan: Plan, mask: AttnMask) -> list[tuple[IntArray, IntArray]]:
        """(query rows, keys) of every kernel call the plan makes, over all ranks."""
        rows, keys = cls.block_sets(plan, mask)
        return [(r, k) for r in rows for k in keys]

    @abstractmethod
    def schedule(
        self, plan: Plan, problem: Problem, rank: int, bwd: bool, price: Pricer
    ) -> list[Window]:
        """Rank ``rank``'s forward (or backward) as the runner runs it (`lcab.cp.stages`).

        Its calls are `block_sets` pairs, made by ``price``; every rank has as many windows
        of as many stages (ranks run in lockstep).
        """

    @classmethod
    def buffers(cls, plan: Plan, problem: Problem, backward: bool) -> dict[str, float]:
        """Bytes a rank holds besides its shards of q, k, v, out (and gradients), per term."""
        if plan.ulysses == 1:
            return {}
        h, elem = plan.heads, element_bytes(problem)
        sharded = plan.shard_len * plan.ulysses * (2 * h.local_q + 2 * h.local_kv) * elem
        terms: dict[str, float] = {"head-sharded q, k, v, out": sharded * problem.head_dim}
        if backward:  # the local backward's dout in, dq, dk, dv out, before the a2a back
            terms["head-sharded dout, dq, dk, dv"] = terms["head-sharded q, k, v, out"]
        return terms

    def block_reasons(
        self, kernel: Kernel, mask: AttnMask, problem: Problem, world: int
    ) -> list[str]:
        """Why ``kernel`` cannot take one of the blocks of ``mask`` this strategy gives it.

        A kernel whose lowering takes any rectangle of a mask it takes (ranges, FFA, Flex, ...)
        is checked once on the whole mask; a varlen kernel on every block (the first refusal
        is reported, with the block).
        """
        if kernel.caps.lowering in BLOCK_CLOSED_LOWERINGS and kernel.rectangle_closed:
            whole = self._local_problem(
                problem, world, self.ulysses_degree(world), (mask.seqlen_q, mask.seqlen_k)
            )
            return [f"kernel {kernel.name}: {r}" for r in kernel.mask_refusals(whole, mask)]
        last = self._last_blocks
        if (
            last is not None
            and last[0] is kernel
            and last[1] is mask
            and last[2:4]
            == (
                problem,
                world,
            )
        ):
            # the runner asks once per pass with the same mask: W^2 blocks are checked once
            # (each costs a restriction and a lowering: ~1 ms, 9,216 of them on 96 ranks)
            return list(last[4])
        reasons = self._first_block_refused(kernel, mask, problem, world)
        self._last_blocks = (kernel, mask, problem, world, reasons)
        return list(reasons)

    def _first_block_refused(
        self, kernel: Kernel, mask: AttnMask, problem: Problem, world: int
    ) -> list[str]:
        plan = self.plan(mask, problem, world)
        seen: set[tuple[int, int, bytes, bytes, bytes]] = set()
        for rows, keys in self.blocks(plan, mask):
            block = remap(mask, rows, keys)
            if not block.num_slices:
                continue
            # equal blocks (most of a ring's, on a regular mask) answer alike: lowered once
            docs = b"" if block.doc_lengths is None else block.doc_lengths.tobytes()
            shape = (len(rows), len(keys), block.slices.tobytes(), block.head_ptr.tobytes(), docs)
            if shape in seen:
                continue
            seen.add(shape)
            local = self._local_problem(problem, world, plan.ulysses, (len(rows), len(keys)))
            why = kernel.mask_refusals(local, block)
            if why:
                return [
                    f"kernel {kernel.name} cannot take a {len(rows)}x{len(keys)} block of the "
                    f"mask that {self.name} gives it ({world} ranks, {self.balancer}): "
                    + "; ".join(why)
                ]
        return []

    def plan(self, mask: AttnMask, problem: Problem, world: int) -> Plan:
        """The plan for ``mask`` on ``world`` ranks (pure; no communication)."""
        ulysses = self.ulysses_degree(world)
        heads, why = head_split(problem.heads_q, problem.heads_kv, ulysses)
        if heads is None:
            raise ValueError(why)
        placement, layouts = plan_layouts(mask, world, ulysses, self.balancer)
        ring = world // ulysses
        plan = Plan(
            strategy=self.name,
            world=world,
            ulysses=ulysses,
            ring=ring,
            windows=self.windows(ring),
            balancer=self.balancer,
            placement=placement,
            rank_layouts=layouts,
            heads=heads,
        )
        return Plan(**{**plan.__dict__, "comm_bytes": self.comm_volume(plan, problem)})

    @abstractmethod
    def comm_volume(self, plan: Plan, problem: Problem) -> dict[str, int]:
        """Analytic bytes one rank sends in one forward + backward, per operation name."""

    @abstractmethod
    def build(
        self, plan: Plan, mask: AttnMask, problem: Problem, kernel: Kernel, dist: DistContext
    ) -> CPPrepared:
        """The callable of ``dist.rank`` for ``plan``, every step's kernel prepared."""


STRATEGIES: Registry[type[Strategy]] = Registry("cp strategy")


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: register ``cls`` under ``cls.name``."""
    STRATEGIES.add(cls.name, cls)
    return cls


def element_bytes(problem: Problem) -> int:
    """Bytes per element of the problem dtype (no tensor made: the planner asks every step)."""
    return dtype_bytes(problem.dtype)


def accumulator_bytes(problem: Problem) -> int:
    """Bytes per element of gradient accumulators that travel the ring (fp32, fp64 for fp64)."""
    return 8 if element_bytes(problem) == 8 else 4
