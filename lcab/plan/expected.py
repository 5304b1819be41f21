"""What a benchmark job is expected to measure and cost, before it is submitted.

For the dry run (``dry_run=true``): what the planner expects a job to *measure* — per-GPU
TFLOP/s and time per pass at each length — and the GPU-hours its measurement protocol spends at
those times (`calls_per_pass`). ``cp=none`` is predicted as a world of one rank; a length with no
prediction says why and adds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from lcab.bench.telemetry import energy_calls
from lcab.bench.telemetry_sources import NvmlSource
from lcab.cell import BenchConfig, Cell
from lcab.config import ConfigError
from lcab.config.fork_map import fork_map, usable_cores
from lcab.plan.hardware import Hardware, auto_profile, from_dict, is_auto, load_profile
from lcab.plan.harness import LCAB, Harness
from lcab.plan.predict import CellPrediction, PlanCell, predict_median

PASS_PARTS = {"fwd": ("fwd",), "bwd": ("bwd",), "fwd_bwd": ("fwd", "bwd")}
"""The predicted passes whose times make each timed pass (fwd_bwd: both)."""


@dataclass(frozen=True)
class LengthExpectation:
    """The planner's word on one length of a job."""

    seqlen: int
    prediction: CellPrediction | None
    reason: str = ""
    """Why there is no prediction (empty when there is one)."""
    wall_s: float = 0.0
    """Expected wall time of this length on every rank (all samples and passes)."""

    def text(self, scale: float = 1.0) -> str:
        """``S: 612 / 498 (12.3 / 35.1 ms)``: forward / backward throughput and time, or why not.

        The throughput is TFLOP/s per GPU times ``scale`` (1000: GFLOP/s, for a CPU job); the
        caller names the unit and the order (fwd / bwd) once, in its header.
        """
        if self.prediction is None:
            return f"{self.seqlen:,}: no prediction ({self.reason})"
        fwd, bwd = self.prediction.fwd, self.prediction.bwd
        return (
            f"{self.seqlen:,}: {fwd.tflops * scale:.3g} / {bwd.tflops * scale:.3g} "
            f"({_times(float(fwd.time_ms), float(bwd.time_ms))})"
        )


def _times(fwd_ms: float, bwd_ms: float) -> str:
    """``12.3 / 35.1 ms`` or ``848 ms / 2.16 s``: never ``2.16e+03 ms``."""
    if max(fwd_ms, bwd_ms) < 1000:
        return f"{fwd_ms:.3g} / {bwd_ms:.3g} ms"
    return " / ".join(
        f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms" for ms in (fwd_ms, bwd_ms)
    )


@dataclass(frozen=True)
class JobExpectation:
    """Every length of one job, and the job's expected cost."""

    hardware: str
    gpus: int
    lengths: tuple[LengthExpectation, ...]
    rate_note: str | None = None
    """Whose rate the job's kernel is costed at, where not its own (`Hardware.rate_origin`)."""
    search_note: str | None = None
    """A frontier search: which probes it is priced at (`search_lengths`)."""

    @property
    def gpu_hours(self) -> float:
        """Expected GPU-hours of the predicted lengths (those without a prediction add 0)."""
        return self.gpus * sum(length.wall_s for length in self.lengths) / 3600


def calls_per_pass(bench: BenchConfig, call_ms: float, gpu: bool = False) -> int:
    """Calls the protocol makes of one pass for one mask sample at ``call_ms`` per call.

    The first call, the warm-up (a count, or what ``warmup_ms`` buys), the timed repetitions
    (a count, or what ``rep_ms`` buys, at least 1 and at most ``max_reps``), one call for the
    numerics check when it is on, and on a ``gpu`` read through NVML the energy window's calls.
    """
    per = max(call_ms, 1e-6)
    warmup = bench.warmup if bench.warmup_ms is None else math.ceil(bench.warmup_ms / per)
    if bench.rep_ms is None:
        reps = bench.reps
    else:
        reps = min(max(math.ceil(bench.rep_ms / per), 1), bench.max_reps)
    nvml = gpu and bench.telemetry in ("auto", "nvml")
    energy = energy_calls(NvmlSource(0), per) if nvml else 0
    return 1 + warmup + reps + int(bench.check_numerics) + energy


def plan_cell(cell: Cell, seqlen: int) -> PlanCell:
    """The planner's cell for one length of a job (cp=none: a one-rank CP cell)."""
    target = PlanCell.of_cell(cell, seqlen)
    if cell.cp == "none":
        return target.with_(cp="ulysses", cp_options={}, nodes=1, devices_per_node=1)
    return target


def expect_length(
    cell: Cell, seqlen: int, hardware: Hardware, harness: Harness = LCAB
) -> LengthExpectation:
    """The prediction of one length and the wall time the protocol spends on it.

    The prediction is the planner's own for the cell (`predict_median` over the job's mask
    samples, as ``python -m lcab.plan`` reports it). A timed backward repeats on one forward,
    which is counted once per sample.
    """
    samples = max(cell.mask_samples, 1)
    try:
        prediction = predict_median(plan_cell(cell, seqlen), hardware, samples, harness)
    except ValueError as err:
        return LengthExpectation(seqlen, None, str(err).split(": ", 1)[-1])
    wall_ms = 0.0
    for pass_ in cell.bench.passes:
        parts = PASS_PARTS.get(pass_, ())
        call_ms = sum(float(prediction.pass_(p).time_ms) for p in parts)
        wall_ms += calls_per_pass(cell.bench, call_ms, cell.device == "cuda") * call_ms
        if pass_ == "bwd":
            wall_ms += float(prediction.fwd.time_ms)
    return LengthExpectation(seqlen, prediction, wall_s=samples * wall_ms / 1000)


def search_lengths(cell: Cell, hardware: Hardware) -> tuple[list[tuple[Cell, int]], str | None]:
    """The lengths a job runs (with the cell whose protocol each runs); for a search, a note.

    A search runs probes until its bracket is narrow, not its one starting length: it is priced
    at the probes the same search makes in the planner's memory model
    (`lcab.plan.frontier.predict_frontier`), which a measured search meets where the model holds,
    each run once, and the frontier it finds timed (`lcab.bench.frontier.search_cells`).
    """
    if cell.frontier is None:
        return [(cell, s) for s in cell.seqlens], None
    from lcab.bench.frontier import search_cells
    from lcab.plan.frontier import predict_cell_frontier

    probe, timed = search_cells(cell)
    budget_gib = cell.bench.memory_budget_gib or hardware.memory_gib
    try:
        found = predict_cell_frontier(cell, hardware)
    except ValueError as err:
        note = f"a frontier search priced at its first probe only ({err})"
        return [(probe, s) for s in cell.seqlens], note
    tokens = "nothing" if found.tokens is None else f"{found.tokens:,} tokens"
    note = (
        f"a frontier search, priced at the {len(found.probes)} probes of the same search in "
        f"the planner's memory model, each run once ({tokens} fit in {budget_gib:g} GiB per "
        "rank there), and the frontier timed"
    )
    runs = [(probe, s) for s in found.probes or cell.seqlens]
    return [*runs, (timed, found.tokens)] if found.tokens else runs, note


def expect_job(cell: Cell, hardware: Hardware, harness: Harness = LCAB) -> JobExpectation:
    """What the planner expects of every length of a job on ``hardware``."""
    runs, search_note = search_lengths(cell, hardware)

    def one_length(run: tuple[Cell, int]) -> LengthExpectation:
        return expect_length(*run, hardware, harness)

    # lengths side by side on every core when the job is alone (a 96-rank dry run of one cell)
    lengths = tuple(fork_map(one_length, runs, usable_cores()))
    gpus = cell.nodes * cell.devices_per_node
    origin = hardware.rate_origin(cell.kernel)
    return JobExpectation(hardware.name, gpus, lengths, origin, search_note)


DEFAULT_PROFILES = {"cuda": "h100_nvlink_ib", "cpu": "cpu_gloo_local"}
"""The profile a dry run predicts with when ``hardware=`` is not given, by the job's device."""


def hardware_for(cfg: DictConfig, cell: Cell) -> Hardware:
    """The job's ``hardware=`` profile, or the default for the device it runs on.

    Raises:
        ConfigError: a malformed profile.

    """
    node = cfg.get("hardware")
    if node is None:
        return load_profile(DEFAULT_PROFILES.get(cell.device, "h100_nvlink_ib"))
    data = OmegaConf.to_container(node, resolve=True)
    try:
        assert isinstance(data, dict)
        plain = {str(k): v for k, v in data.items()}
        if is_auto(plain):  # the profile of where this job runs, not of this host
            return auto_profile(cell.device)
        return from_dict(plain)
    except (TypeError, KeyError, AssertionError) as err:
        raise ConfigError("hardware", node.get("name"), f"malformed profile: {err}") from err


def expect_configured_job(cfg: DictConfig, cell: Cell) -> JobExpectation:
    """`expect_job` on the job's own profile (what ``dry_run=true`` prints)."""
    return expect_job(cell, hardware_for(cfg, cell))
