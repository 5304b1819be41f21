"""One cell predicted: the runner's own plan, replayed on a hardware profile.

`PlanCell` is what a prediction needs (the same fields a `lcab.cell.Cell` or a `RunRecord`
carries, for one length); `predict` builds the mask exactly as the runner does (pattern, length,
parameters, seed of the first sample), asks the strategy for its plan, replays it and costs it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lcab.cell import Cell
from lcab.cp import STRATEGIES
from lcab.kernels import Problem
from lcab.masks import make_mask
from lcab.masks.core import AttnMask
from lcab.plan.hardware import Hardware
from lcab.plan.harness import LCAB, Harness
from lcab.plan.memory import memory_terms, rank_extras
from lcab.plan.model import PassPrediction, predict_pass
from lcab.plan.replay import replay
from lcab.records.schema import RunRecord


@dataclass(frozen=True)
class PlanCell:
    """One (strategy, kernel, mask, length, topology) to predict."""

    cp: str
    kernel: str
    mask: str
    seqlen: int
    nodes: int
    devices_per_node: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    cp_options: dict[str, Any] = field(default_factory=dict)
    mask_params: dict[str, Any] = field(default_factory=dict)
    mask_seed: int = 0

    @property
    def world(self) -> int:
        """Ranks."""
        return self.nodes * self.devices_per_node

    def problem(self) -> Problem:
        """The global attention problem, named: no tensor is made, so torch is never loaded.

        Its placement (``cpu``) only matters for its dtype's size.
        """
        return Problem(
            self.seqlen, self.seqlen, self.heads_q, self.heads_kv, self.head_dim, self.dtype, "cpu"
        )

    def label(self) -> str:
        """Short name for tables."""
        return f"{self.cp}/{self.mask}/{self.nodes}x{self.devices_per_node}/S={self.seqlen}"

    @classmethod
    def of_cell(cls, cell: Cell, seqlen: int) -> PlanCell:
        """The cell of a resolved config, at one of its lengths."""
        return cls(
            cp=cell.cp,
            kernel=cell.kernel,
            mask=cell.mask,
            seqlen=seqlen,
            nodes=cell.nodes,
            devices_per_node=cell.devices_per_node,
            heads_q=cell.heads_q,
            heads_kv=cell.heads_kv,
            head_dim=cell.head_dim,
            dtype=cell.dtype,
            cp_options=dict(cell.cp_options),
            mask_params=dict(cell.mask_params),
            mask_seed=cell.mask_seed,
        )

    @classmethod
    def of_record(cls, record: RunRecord) -> PlanCell:
        """The cell a record measured (its resolved config gives the strategy's options)."""
        cp_cfg = dict(record.config.get("cp") or {})
        cp_cfg.pop("name", None)
        mask_cfg = dict(record.config.get("mask") or {})
        mask_cfg.pop("name", None)
        mask_cfg.pop("seed", None)
        if "heads" in mask_cfg and mask_cfg["heads"] is None:
            mask_cfg["heads"] = record.heads_kv
        return cls(
            cp=record.cp,
            kernel=record.kernel,
            mask=record.mask,
            seqlen=record.seqlen,
            nodes=record.nodes,
            devices_per_node=record.devices_per_node,
            heads_q=record.heads_q,
            heads_kv=record.heads_kv,
            head_dim=record.head_dim,
            dtype=record.dtype,
            cp_options=cp_cfg,
            mask_params=mask_cfg,
            mask_seed=int(record.mask_seed or 0),
        )

    def with_(self, **changes: Any) -> PlanCell:
        """A copy with fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class CellPrediction:
    """What the planner says about one cell."""

    cell: PlanCell
    fwd: PassPrediction
    bwd: PassPrediction
    memory_mib: float
    memory_terms: dict[str, float]
    ulysses: int
    ring: int
    windows: int
    balancer: str
    imbalance: float
    """max / mean attended area over the ring shards (the plan's figure)."""
    padding_tokens: int

    def pass_(self, name: str) -> PassPrediction:
        """The prediction of pass ``name`` (fwd or bwd)."""
        return self.fwd if name == "fwd" else self.bwd

    def row(self) -> dict[str, Any]:
        """Flat dict for tables and JSON lines."""
        out: dict[str, Any] = {
            "cp": self.cell.cp,
            "kernel": self.cell.kernel,
            "mask": self.cell.mask,
            "seqlen": self.cell.seqlen,
            "world": self.cell.world,
            "nodes": self.cell.nodes,
            "ulysses": self.ulysses,
            "ring": self.ring,
            "windows": self.windows,
            "balancer": self.balancer,
            "imbalance": round(self.imbalance, 4),
            "padding_tokens": self.padding_tokens,
            "memory_mib": round(self.memory_mib, 1),
        }
        for name in ("fwd", "bwd"):
            p = self.pass_(name)
            for key, value in dataclasses.asdict(p).items():
                out[f"{name}_{key}"] = round(value, 4) if isinstance(value, float) else value
        return out


def strategy_for(cell: PlanCell) -> Any:
    """The registered strategy with the cell's options (ValueError names the valid ones)."""
    return STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)


def mask_for(cell: PlanCell, sample: int = 0) -> AttnMask:
    """Mask sample ``sample`` as the runner builds it for this cell (seed = mask_seed + sample)."""
    return make_mask(cell.mask, cell.seqlen, seed=cell.mask_seed + sample, **cell.mask_params)


def cell_reasons(cell: PlanCell) -> list[str]:
    """Why the strategy cannot run this cell (empty: it can)."""
    if cell.cp == "none":
        return ["cp=none runs on one device; the planner predicts context-parallel cells"]
    return list(strategy_for(cell).reasons(cell.problem(), cell.world))


def predict(
    cell: PlanCell, hardware: Hardware, mask: AttnMask | None = None, harness: Harness = LCAB
) -> CellPrediction:
    """Predict ``cell`` on ``hardware`` as ``harness`` implements it (default: lcab's runner).

    ``mask``: reuse one already built for the cell.

    Raises:
        ValueError: the strategy cannot run the cell (its reasons).

    """
    reasons = cell_reasons(cell)
    if reasons:
        raise ValueError(f"{cell.label()}: " + "; ".join(reasons))
    strategy = strategy_for(cell)
    mask = mask if mask is not None else mask_for(cell)
    problem = cell.problem()
    plan = strategy.plan(mask, problem, cell.world)
    diagonal = hardware.rate(cell.kernel).diagonal_rows > 0  # else nothing costs the edges
    replayed = replay(strategy, mask, problem, cell.world, plan, harness, diagonal)
    extras = rank_extras(cell.kernel, hardware.memory(cell.kernel), mask, problem, plan)
    terms = memory_terms(plan, problem, backward=True, extras=extras)
    return CellPrediction(
        cell=cell,
        fwd=predict_pass(replayed, hardware, cell.kernel, "fwd"),
        bwd=predict_pass(replayed, hardware, cell.kernel, "bwd"),
        memory_mib=float(sum(terms.values())),
        memory_terms=terms,
        ulysses=plan.ulysses,
        ring=plan.ring,
        windows=plan.windows,
        balancer=plan.balancer,
        imbalance=plan.imbalance(mask),
        padding_tokens=plan.padding_tokens,
    )


def predict_median(
    cell: PlanCell, hardware: Hardware, samples: int = 1, harness: Harness = LCAB
) -> CellPrediction:
    """The prediction of the median of ``samples`` mask samples by throughput.

    The runner reports the median over mask samples of each sample's TFLOP/s; the planner
    predicts the same samples and keeps the one of median forward + backward throughput whole
    (its time split stays that of one real mask). Document masks vary a lot between samples —
    a 64K pack may hold two documents or twenty — which is why one sample is not enough.
    """
    masks = [mask_for(cell, s) for s in range(max(samples, 1))]
    predictions = [predict(cell, hardware, m, harness) for m in masks]
    predictions.sort(key=_step_tflops)
    return predictions[(len(predictions) - 1) // 2]


def _step_tflops(p: CellPrediction) -> float:
    """Forward + backward throughput per GPU (time-weighted mean of the two passes)."""
    work = p.fwd.tflops * p.fwd.time_ms + p.bwd.tflops * p.bwd.time_ms
    return work / (p.fwd.time_ms + p.bwd.time_ms)
