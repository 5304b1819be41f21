"""The planner's memory frontier: the longest sequence its memory model fits in a budget.

The same search as the measured one (`lcab.bench.frontier.search`: doubling from the cell's
length, bisection to ``1/seqlen.frontier_resolution``, whole 128-token blocks per rank), with a
probe that asks the memory model (`lcab.plan.memory`) instead of running: a length fits when
the fullest rank's memory is within the budget (`predict_cell_frontier`) less the profile's
``memory_margin``. A profile without kernel memory terms gives the tensors' frontier alone, an
upper bound. Measured frontiers are checked by searching each again in the model
(`check_memory`). The plan guide's "The memory frontier" has the terms and the figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lcab.bench.frontier import FITS, NO_ROOM, search
from lcab.cell import TILE_TOKENS, Cell
from lcab.plan.hardware import Hardware, KernelMemory
from lcab.plan.memory import RankExtras, memory_terms, rank_extras, single_device_terms
from lcab.plan.predict import PlanCell, cell_reasons, mask_for, strategy_for
from lcab.records.schema import RunRecord


@dataclass(frozen=True)
class FrontierPrediction:
    """The longest total length the model fits, and what it holds there."""

    cell: PlanCell
    budget_mib: float
    tokens: int | None
    """Longest total length within the budget (None: not even one block per rank)."""
    bracket: tuple[int | None, int | None]
    memory_mib: float | None
    """Memory of the fullest rank at ``tokens``."""
    probes: tuple[int, ...] = ()
    """The lengths the search tried, in order (what a measured search would run, if the model
    is right)."""

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


def rank_memory_mib(
    cell: PlanCell, backward: bool, hardware: Hardware | None = None, flush_l2: bool = False
) -> float:
    """Memory of the fullest rank of ``cell`` (`lcab.plan.memory`'s terms, summed)."""
    return float(sum(rank_memory_terms(cell, backward, hardware, flush_l2).values()))


def rank_memory_terms(
    cell: PlanCell, backward: bool, hardware: Hardware | None = None, flush_l2: bool = False
) -> dict[str, float]:
    """MiB of each term of the fullest rank: tensors, buffers, and ``hardware``'s own terms.

    ``hardware=None``: the tensors and buffers alone. ``flush_l2``: a CUDA cell's L2 flush.
    """
    problem = cell.problem()
    kernel = hardware.memory(cell.kernel) if hardware is not None else KernelMemory()
    if cell.cp == "none":
        extras = RankExtras(kernel, flush_l2=flush_l2)
        if kernel.dense_bytes:  # a mask is built only where it may count
            extras = rank_extras(cell.kernel, kernel, mask_for(cell), problem, None, flush_l2)
        return single_device_terms(problem, backward, extras)
    reasons = cell_reasons(cell)
    if reasons:
        raise ValueError(f"{cell.label()}: " + "; ".join(reasons))
    mask = mask_for(cell)
    plan = strategy_for(cell).plan(mask, problem, cell.world)
    extras = rank_extras(cell.kernel, kernel, mask, problem, plan, flush_l2)
    return memory_terms(plan, problem, backward, extras)


def predict_frontier(
    cell: PlanCell,
    budget_mib: float,
    backward: bool,
    limit: int,
    resolution: int,
    hardware: Hardware | None = None,
    flush_l2: bool = False,
) -> FrontierPrediction:
    """Search ``cell``'s frontier in the model, from ``cell.seqlen`` up to ``limit`` tokens.

    ``hardware``: whose kernel memory terms and margin count (None: the tensors and buffers
    alone, the whole budget).
    """
    memory: dict[int, float] = {}
    usable = budget_mib if hardware is None else hardware.usable_mib(budget_mib)

    def verdict(length: int) -> str:
        at = dataclasses.replace(cell, seqlen=length)
        memory[length] = rank_memory_mib(at, backward, hardware, flush_l2)
        return FITS if memory[length] <= usable else NO_ROOM

    step = TILE_TOKENS * cell.world
    state = search(verdict, cell.seqlen, limit, step, resolution)
    return FrontierPrediction(
        cell=cell,
        budget_mib=budget_mib,
        tokens=state.fits,
        bracket=(state.fits, state.fails),
        memory_mib=None if state.fits is None else memory[state.fits],
        probes=tuple(length for length, _ in state.probes),
    )


def predict_cell_frontier(
    cell: Cell, hardware: Hardware, budget_gib: float | None = None
) -> FrontierPrediction:
    """The search of a ``seqlen=frontier`` cell, as its own config asks, in ``hardware``'s model.

    The budget is ``bench.memory_budget_gib``, else ``budget_gib`` (what the job may use:
    `lcab.bench.job_memory.job_budget`), else the profile's ``memory_gib``. Raises ValueError
    where the strategy cannot run the cell.
    """
    assert cell.frontier is not None
    budget_gib = cell.bench.memory_budget_gib or budget_gib or hardware.memory_gib
    return predict_frontier(
        PlanCell.of_cell(cell, cell.seqlens[0]),
        budget_gib * 1024,
        any(p != "fwd" for p in cell.bench.passes),
        cell.frontier.max_tokens,
        cell.frontier.resolution,
        hardware,
        cell.device == "cuda" and cell.bench.flush_l2,
    )


@dataclass(frozen=True)
class FrontierPoint:
    """One measured frontier: the cell, its budget and the bracket around its limit."""

    cell: PlanCell
    """The cell at the first probe's length (where a search starts)."""
    budget_mib: float
    fits: int
    fails: int
    backward: bool
    limit: int
    resolution: int

    @property
    def middle(self) -> PlanCell:
        """The cell at the middle of the bracket, where its memory is taken to be the budget."""
        return dataclasses.replace(self.cell, seqlen=(self.fits + self.fails) // 2)

    def label(self) -> str:
        """Kernel, strategy, mask and budget, for tables."""
        return (
            f"{self.cell.kernel}/{self.cell.cp}/{self.cell.mask} @ {self.budget_mib / 1024:g} GiB"
        )


SEARCHED = ("ok", "numerics_mismatch", "oom")
"""Probe statuses of a search that ran to its end (`lcab.bench.frontier`)."""


def frontier_points(records: list[RunRecord]) -> list[FrontierPoint]:
    """The records that found a limit under a stated budget, one per cell.

    Both ends of the bracket known, every probe ``ok`` or ``oom``; a cell searched again under
    the same budget and search counts once, at its shortest frontier (twice the weight
    otherwise; the safe side).
    """
    points: dict[str, FrontierPoint] = {}
    for r in records:
        bracket = r.frontier_bracket or [None, None]
        if r.frontier_budget_gib is None or None in bracket or not r.frontier_probes:
            continue
        if any(p.get("status") not in SEARCHED for p in r.frontier_probes):
            continue  # the search stopped (a probe's error): its bracket is not the limit's
        seqlen = dict(r.config.get("seqlen") or {})
        start = int(r.frontier_probes[0]["seqlen"])
        point = FrontierPoint(
            cell=PlanCell.of_record(r).with_(seqlen=start),
            budget_mib=float(r.frontier_budget_gib) * 1024,
            fits=int(bracket[0]),  # type: ignore[arg-type]
            fails=int(bracket[1]),  # type: ignore[arg-type]
            backward=any(p != "fwd" for p in r.passes),
            limit=int(seqlen.get("frontier_max") or 1 << 24),
            resolution=int(seqlen.get("frontier_resolution") or 16),
        )
        same = repr(dataclasses.replace(point, fits=0, fails=0))
        if same not in points or point.fits < points[same].fits:
            points[same] = point
    return list(points.values())


@dataclass(frozen=True)
class FrontierCheck:
    """A measured frontier beside the one ``hardware``'s model finds for the same search."""

    point: FrontierPoint
    predicted: int | None

    @property
    def ratio(self) -> float | None:
        """Measured / predicted tokens."""
        return self.point.fits / self.predicted if self.predicted else None

    @property
    def safe(self) -> bool:
        """Predicted ≤ measured: the length the planner gives would have run."""
        return self.predicted is None or self.predicted <= self.point.fits


def check_memory(points: list[FrontierPoint], hardware: Hardware) -> list[FrontierCheck]:
    """Each point's frontier searched in ``hardware``'s model from the same start."""
    return [
        FrontierCheck(
            p,
            predict_frontier(
                p.cell, p.budget_mib, p.backward, p.limit, p.resolution, hardware
            ).tokens,
        )
        for p in points
    ]


def within(checks: list[FrontierCheck], band: float = 0.25) -> int:
    """How many checks have their predicted frontier within ``band`` of the measured one."""
    return sum(1 for c in checks if c.ratio is not None and abs(c.ratio - 1) <= band)
