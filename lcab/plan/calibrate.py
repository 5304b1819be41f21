"""The planner held to measured records: one point per measured pass, predicted beside it.

Each ``ok`` record gives one point per timed pass: the cell, the pass and its p50 time (the
slowest rank's under CP). ``cp=none`` records are one kernel call over the whole mask, so a
GPU's own kernel sweep checks (and fits) the profile's kernel rates. ``python -m lcab.plan
--check RECORDS`` prints each point beside its prediction; ``launchers/plan_fit.py`` fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from lcab.cp.base import STRATEGIES
from lcab.masks.core import AttnMask
from lcab.plan.areas import pair_work
from lcab.plan.hardware import Hardware
from lcab.plan.model import CostModel, predict_pass
from lcab.plan.predict import PlanCell, mask_for
from lcab.plan.replay import Replay, replay
from lcab.plan.steps import Work, dense_rectangle
from lcab.records.schema import RunRecord


@dataclass(frozen=True)
class Point:
    """One measured pass of one cell, with the cell's replay."""

    cell: PlanCell
    pass_: str
    measured_ms: float
    replay: Replay | None
    """The CP cell's replay; None for a single-device kernel call (``single``)."""
    record: RunRecord | None
    single: Work | None = None

    def predicted_ms(self, hardware: Hardware) -> float:
        """The model's time for this pass on ``hardware``."""
        if self.replay is None:
            model = CostModel(hardware, self.cell.kernel, 1, alone=True)
            return 1e3 * model.compute_s(self.single, self.pass_ == "bwd")
        return predict_pass(self.replay, hardware, self.cell.kernel, self.pass_).time_ms


def points_of(records: Iterable[RunRecord]) -> list[Point]:
    """One point per measured cell and pass of the ``ok`` records (fwd and bwd p50 times).

    A cell measured in several runs gives one point at their median: one stalled run does not
    decide it, and every cell weighs the same in a fit. Records whose ranks shared a GPU
    (``shared_device``) are no measurement of time and give no point.
    """
    runs_of: dict[str, list[RunRecord]] = {}
    for record in records:
        if record.status != "ok" or (record.cp != "none" and record.world_size < 2):
            continue
        if not record.timings_measured:
            continue
        runs_of.setdefault(repr(PlanCell.of_record(record)), []).append(record)
    points = []
    for runs in runs_of.values():
        cell = PlanCell.of_record(runs[0])
        calls: dict[str, Work | None]
        replayed: Replay | None
        if cell.cp == "none":
            forward = whole_mask_call(mask_for(cell), cell.heads_q, cell.heads_kv, cell.head_dim)
            replayed, calls = None, {"fwd": forward, "bwd": _backward_call(forward)}
        else:
            strategy = STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)
            replayed = replay(strategy, mask_for(cell), cell.problem(), cell.world)
            calls = {"fwd": None, "bwd": None}
        for pass_, single in calls.items():
            median = _median_run(runs, pass_)
            if median is not None:
                ms, record = median
                points.append(Point(cell, pass_, ms, replayed, record, single))
    return points


def _median_run(runs: list[RunRecord], pass_: str) -> tuple[float, RunRecord] | None:
    """The median p50 time of ``pass_`` over ``runs``, and the run that measured it.

    Of an even number of runs, the median is the mean of the middle two and the record the
    faster of them. None when no run measured the pass.
    """
    timed = sorted(
        (float(ms), i)
        for i, r in enumerate(runs)
        if r.pass_result(pass_).status == "ok" and (ms := r.pass_result(pass_).ms_p50)
    )
    if not timed:
        return None
    middle = (len(timed) - 1) // 2
    return float(np.median([ms for ms, _ in timed])), runs[timed[middle][1]]


def _backward_call(forward: Work) -> Work:
    """A single-device kernel's backward: the forward call at 2.5 times its FLOPs."""
    return dataclasses.replace(forward, flops=forward.flops * 2.5)


def whole_mask_call(mask: AttnMask, heads_q: int, heads_kv: int, head_dim: int) -> Work:
    """The forward call of one kernel over the whole of ``mask``.

    Described as the replay describes a context-parallel step's call (keys per row, queries per
    key, tiles, tensors); a backward is the same call with 2.5 times the FLOPs.
    """
    square = mask.seqlen_q == mask.seqlen_k
    work = pair_work(mask, [np.arange(mask.seqlen_q)], [np.arange(mask.seqlen_k)], square)
    # documents with attended keys: the key runs of the call (0 when columns are not counted)
    key_docs = _head_mean(work.col_docs)
    dense_rows, dense_keys = dense_rectangle(
        mask.area() / mask.num_heads, mask.seqlen_q, mask.seqlen_k
    )
    return Work(
        flops=4.0 * mask.area() * (heads_q // mask.num_heads) * head_dim,
        mean_keys=_head_mean(work.mean_keys),
        rows=_head_mean(work.rows),
        runs=_head_mean(work.runs),
        q_per_kv=heads_q / max(heads_kv, 1),
        mean_queries=_head_mean(work.mean_queries),
        q_elements=mask.seqlen_q * heads_q * head_dim,
        kv_elements=mask.seqlen_k * heads_kv * head_dim,
        q_row_elements=heads_q * head_dim,
        kv_row_elements=heads_kv * head_dim,
        key_columns=_head_mean(work.cols),
        key_documents=key_docs,
        key_runs=key_docs,
        diagonal_rows=_head_mean(work.diagonal_rows),
        diagonal_runs=_head_mean(work.diagonal_runs),
        head_dim=head_dim,
        q_heads=heads_q,
        dense_rows=dense_rows,
        dense_keys=dense_keys,
    )


def _head_mean(values: np.ndarray | None) -> float:
    """The mean over mask heads of a one-pair figure (0 where it was not counted)."""
    return float(np.mean(values[:, 0, 0])) if values is not None else 0.0


def start_value(hardware: Hardware, name: str) -> float:
    """Where a log-space fit starts a parameter: at its value.

    An unset backward value (``bwd_half_keys``, ``bwd_bias_bytes``) starts from the forward's;
    a 0 (a call cost fitted away) from 1, since a logarithm cannot start at 0.
    """
    node: object = hardware.to_dict()
    for part in name.split("."):
        parent, node = node, node[part]  # type: ignore[index]
    last = name.rsplit(".", 1)[-1]
    if node is None and last.startswith("bwd_"):  # bwd_half_keys, bwd_bias_bytes
        node = parent[last.removeprefix("bwd_")]  # type: ignore[index]
    value = float(node)  # type: ignore[arg-type]
    return value if value > 0 else 1.0


@dataclass(frozen=True)
class CheckRow:
    """Predicted vs measured for one pass of one record."""

    label: str
    pass_: str
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        """Relative error of the prediction ((predicted - measured) / measured)."""
        return self.predicted_ms / self.measured_ms - 1.0


def check(points: list[Point], hardware: Hardware) -> list[CheckRow]:
    """Predicted vs measured for every point."""
    return [
        CheckRow(p.cell.label(), p.pass_, p.measured_ms, p.predicted_ms(hardware)) for p in points
    ]
