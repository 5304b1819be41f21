"""The planner's memory frontier: the longest sequence its memory model fits in a budget.

The same search as the measured one (`lcab.bench.frontier.search`: doubling from the cell's
length, bisection to ``1/seqlen.frontier_resolution``, whole 128-token blocks per rank), with a
probe that asks the memory model (`lcab.plan.memory`) instead of running: a length fits when
the attention memory of the fullest rank is within the budget — ``bench.memory_budget_gib``
when set, else the profile's ``memory_gib``. One device (``cp=none``) holds q, k, v and out
(and dout, dq, dk, dv with a backward pass); under CP the strategy's own plan gives each rank's
shard, head split and buffers.

What the model leaves out (the module docstring of `lcab.plan.memory`: the rest of a model,
kernel workspaces, the allocator's slack, a CPU process's own heap) is why a measured frontier
can fall short of this one; the record and the table print both, with their ratio.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lcab.bench.frontier import FITS, NO_ROOM, search
from lcab.cell import TILE_TOKENS
from lcab.cp.base import element_bytes
from lcab.plan.memory import MIB, memory_mib
from lcab.plan.predict import PlanCell, cell_reasons, mask_for, strategy_for


@dataclass(frozen=True)
class FrontierPrediction:
    """The longest total length the model fits, and what it holds there."""

    cell: PlanCell
    budget_mib: float
    tokens: int | None
    """Longest total length within the budget (None: not even one block per rank)."""
    bracket: tuple[int | None, int | None]
    memory_mib: float | None
    """Attention memory of the fullest rank at ``tokens``."""

    def row(self) -> dict[str, Any]:
        """One JSON row of the planner's output (``plan.jsonl``)."""
        world = self.cell.world
        return {
            "cp": self.cell.cp,
            "kernel": self.cell.kernel,
            "mask": self.cell.mask,
            "world": world,
            "layout": f"{self.cell.nodes}x{self.cell.devices_per_node}",
            "frontier_tokens": self.tokens,
            "frontier_tokens_per_device": None if self.tokens is None else self.tokens // world,
            "frontier_bracket": list(self.bracket),
            "frontier_memory_mib": None if self.memory_mib is None else round(self.memory_mib, 1),
            "budget_gib": round(self.budget_mib / 1024, 3),
        }


def rank_memory_mib(cell: PlanCell, backward: bool) -> float:
    """Attention memory of the fullest rank of ``cell`` (`lcab.plan.memory`'s terms)."""
    problem = cell.problem()
    if cell.cp == "none":
        elem = element_bytes(problem)
        tokens = cell.seqlen * problem.head_dim * elem
        held = 2 * tokens * (problem.heads_q + problem.heads_kv)  # q, out, k, v
        return held * (2 if backward else 1) / MIB  # dout, dq, dk, dv
    reasons = cell_reasons(cell)
    if reasons:
        raise ValueError(f"{cell.label()}: " + "; ".join(reasons))
    plan = strategy_for(cell).plan(mask_for(cell), problem, cell.world)
    return memory_mib(plan, problem, backward)


def predict_frontier(
    cell: PlanCell,
    budget_mib: float,
    backward: bool,
    limit: int,
    resolution: int,
) -> FrontierPrediction:
    """Search ``cell``'s frontier in the model, from ``cell.seqlen`` up to ``limit`` tokens."""
    memory: dict[int, float] = {}

    def verdict(length: int) -> str:
        memory[length] = rank_memory_mib(dataclasses.replace(cell, seqlen=length), backward)
        return FITS if memory[length] <= budget_mib else NO_ROOM

    step = TILE_TOKENS * cell.world
    state = search(verdict, cell.seqlen, limit, step, resolution)
    return FrontierPrediction(
        cell=cell,
        budget_mib=budget_mib,
        tokens=state.fits,
        bracket=(state.fits, state.fails),
        memory_mib=None if state.fits is None else memory[state.fits],
    )
