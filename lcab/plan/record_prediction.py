"""Every record carries what the planner expected of its cell, and a warning when far off.

`record_predictor` is called by the entry point (`lcab.main`) once per job, before the cell
runs: it predicts every length of the cell on the profile that matches where it runs and
returns a function that writes the prediction into each record as it is written. Predicting
first keeps the planner's CPU work out of the timed lengths (on a CPU host the ranks share the
cores with the parent), and one hook in the entry point's ``write`` covers every path that
records: supervised worlds, a scheduled rank 0 (SLURM) and in-process cells.

Fields: the records guide; ``predicted_ratio`` = predicted time / measured p50 time (measured
over predicted throughput, independent of FLOP conventions). The warning band, [0.5, 2], is
nearly twice the worst validated miss in log terms (the plan guide's "Predictions in records").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lcab.cell import Cell
from lcab.records.schema import RunRecord, busy_host

BAND = (0.5, 2.0)
"""Measured / predicted throughput outside this range warns (module docstring)."""

PASS_PARTS = {"fwd": ("fwd",), "bwd": ("bwd",), "fwd_bwd": ("fwd", "bwd")}
"""The predicted passes whose times make each timed pass."""

Annotate = Callable[[RunRecord], None]


def _hardware(node: Any, device: str) -> Any:
    """The profile for a job's ``hardware`` node (None or auto: `auto_profile` by device)."""
    from omegaconf import DictConfig, OmegaConf

    from lcab.plan.hardware import auto_profile, from_dict, is_auto, load_profile

    if node is None:
        return auto_profile(device)
    if isinstance(node, str):
        return auto_profile(device) if node == "auto" else load_profile(node)
    raw = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(raw, dict):
        raise TypeError(f"hardware node is {type(raw).__name__}, not a mapping")
    data: dict[str, Any] = {str(k): v for k, v in raw.items()}
    return auto_profile(device) if is_auto(data) else from_dict(data)


def record_predictor(cfg: Any, cell: Cell) -> Annotate:
    """Predict every length of ``cell`` now; return what writes the prediction into a record.

    ``cfg.hardware`` chooses the profile (unset or ``auto``: by the cell's device). Nothing
    here stops a run: a profile or prediction that fails leaves a ``prediction_note``.
    """
    try:
        from lcab.plan.expected import expect_length

        hardware = _hardware(cfg.get("hardware") if cfg is not None else None, cell.device)
        lengths = {s: expect_length(cell, s, hardware) for s in cell.seqlens}
    except Exception as err:  # the run goes on without predictions; the records say why
        note = f"no prediction: {type(err).__name__}: {err}"
        return lambda record: _note(record, note[:300])

    frontier = _frontier_of(cell, hardware) if cell.frontier is not None else None

    def annotate(record: RunRecord) -> None:
        if frontier is not None:
            _attach_frontier(record, frontier)
        expected = lengths.get(record.seqlen)
        record.predicted_hardware = hardware.name
        if expected is None or expected.prediction is None:
            reason = expected.reason if expected is not None else "length not predicted"
            _note(record, f"no prediction: {reason}")
            return
        try:
            attach(record, expected.prediction)
        except Exception as err:  # never cost a record
            _note(record, f"no prediction: {type(err).__name__}: {err}"[:300])

    return annotate


def _note(record: RunRecord, note: str) -> None:
    record.prediction_note = note


def _frontier_of(cell: Cell, hardware: Any) -> tuple[int | None, float, str] | str:
    """The planner's frontier for a ``seqlen=frontier`` cell, its budget and whence, or why none.

    The budget per rank as `lcab.plan.frontier.predict_cell_frontier` takes it.
    """
    from lcab.bench.job_memory import job_budget
    from lcab.plan.frontier import predict_cell_frontier

    try:
        set_gib = cell.bench.memory_budget_gib
        limit = (set_gib, "bench.memory_budget_gib") if set_gib is not None else None
        limit = limit or job_budget(cell.device, cell.devices_per_node)
        limit = limit or (hardware.memory_gib, f"hardware profile {hardware.name}'s memory_gib")
        return predict_cell_frontier(cell, hardware, limit[0]).tokens, *limit
    except Exception as err:  # never cost the search
        return f"no predicted frontier: {type(err).__name__}: {err}"[:300]


def _attach_frontier(record: RunRecord, frontier: tuple[int | None, float, str] | str) -> None:
    """The planner's frontier beside the measured one, their ratio, and its budget."""
    if isinstance(frontier, str):
        record.prediction_note = frontier
        return
    tokens, record.frontier_predicted_budget_gib, record.frontier_budget_limit = frontier
    record.frontier_predicted_tokens = tokens
    if tokens and record.frontier_tokens:
        record.frontier_predicted_ratio = record.frontier_tokens / tokens


def attach(record: RunRecord, prediction: Any, band: tuple[float, float] = BAND) -> None:
    """Write ``prediction`` (a `CellPrediction`) into ``record``; warn when out of ``band``."""
    off: list[str] = []
    slower = False  # some pass slower than the band allows
    # ranks that shared a GPU (a numerics-only check): their times are no measurement
    measured = getattr(record, "timings_measured", True)
    for name in record.passes:
        parts = PASS_PARTS.get(name)
        if not parts:
            continue
        result = record.pass_result(name)
        times = [float(prediction.pass_(p).time_ms) for p in parts]
        rates = [float(prediction.pass_(p).tflops) for p in parts]
        predicted_ms = sum(times)
        result.predicted_ms = predicted_ms
        result.predicted_tflops = (
            sum(r * t for r, t in zip(rates, times, strict=True)) / predicted_ms
            if predicted_ms > 0
            else None
        )
        if result.status != "ok" or not result.ms_p50 or predicted_ms <= 0 or not measured:
            continue
        ratio = predicted_ms / result.ms_p50
        result.predicted_ratio = ratio
        slower = slower or ratio < band[0]
        if not band[0] <= ratio <= band[1]:
            off.append(
                f"{name} {ratio:.3g}x ({result.ms_p50:.4g} ms, {predicted_ms:.4g} predicted)"
            )
    if off and record.status == "ok":
        why = busy_host(record) if slower else ""  # a busy host explains a slow run
        record.prediction_warning = (
            f"off the plan: {'; '.join(off)}: measured/predicted throughput outside "
            f"[{band[0]:g}, {band[1]:g}] on {record.predicted_hardware}"
        ) + why
