"""Run one cell on one rank: for each length, masks → setup → timed passes → numerics → record.

Nothing here raises for a failing kernel: unsupported passes become ``skipped`` (static checks
first, so a skip costs milliseconds), an out-of-memory error ``oom``, any other ``error``, a
result off the fp64 reference ``numerics_mismatch`` (timing kept). Under CP a failure inside a
collective is re-raised instead: peers wait in it, so the supervisor ends the cell.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeAlias

from lcab.bench import host_load
from lcab.bench.artifacts import profile_pass, save_mask_picture_of, trace_path
from lcab.bench.checking import NumericsCheck
from lcab.bench.environment import environment, kernel_provenance
from lcab.bench.inputs import SeededInputs
from lcab.bench.masking import build_mask_sample
from lcab.bench.memory import PeakMemory
from lcab.bench.numerics import tolerance
from lcab.bench.pass_telemetry import LengthTelemetry, device_source
from lcab.bench.results import (
    SampleMeasure,
    base_record,
    fill_mask_fields,
    is_oom,
    short_error,
    summarise,
)
from lcab.bench.targets import Target, pass_callable
from lcab.bench.timing import (
    TimingConfig,
    l2_flush_buffer,
    measure,
    quantiles,
    repeat,
)
from lcab.cell import Cell
from lcab.flops import as_pass, attention_flops, dense_flops
from lcab.kernels import KERNELS, PreparedAttention, Problem
from lcab.lazy import lazy_module
from lcab.masks import AttnMask
from lcab.records.schema import RunRecord

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

Tensors: TypeAlias = "dict[str, torch.Tensor]"


class _LengthRun:
    """The state of one (cell, seqlen) while its phases run; `record` is the result."""

    def __init__(self, cell: Cell, target: Target, seqlen: int, env: dict[str, Any]) -> None:
        self.cell, self.target, self.seqlen = cell, target, seqlen
        self.record = base_record(cell, seqlen, env)
        self.problem = Problem(
            seqlen,
            seqlen,
            cell.heads_q,
            cell.heads_kv,
            cell.head_dim,
            cell.torch_dtype,
            torch.device(cell.device),
        )
        self.collective = target.world > 1
        self.passes: list[str] = list(cell.bench.passes)
        self.results = {p: self.record.pass_result(p) for p in self.passes}
        self.live: list[str] = []
        self.samples: dict[str, list[SampleMeasure]] = {}
        self.setup_mask_ms: list[float] = []
        self.setup_prepare_ms: list[float] = []
        bench = cell.bench
        self.timing = TimingConfig(
            warmup=bench.warmup,
            reps=bench.reps,
            warmup_ms=bench.warmup_ms,
            rep_ms=bench.rep_ms,
            max_reps=bench.max_reps,
            quantiles=tuple(bench.quantiles),
            flush_l2=bench.flush_l2,
        )
        source = device_source(cell.bench.telemetry, cell.device, self.problem.torch_device.index)
        self.telemetry = LengthTelemetry(
            source,
            cell.bench.telemetry_interval_ms,
            target.gather,
            shared_counter=source is not None and source.kind == "host",
        )
        self.tolerance = tolerance(self.problem.dtype, cell.bench.tolerance)
        self.check = NumericsCheck(
            target,
            self.problem,
            self.record,
            cell.heads_q * seqlen * seqlen <= cell.bench.numerics_full_max,
            cell.bench.numerics_rows,
            cell.seed,
        )

    def static_skips(self) -> bool:
        """Skip what cannot run before any mask or tensor exists; whether anything is left."""
        for p in self.passes:
            why = self.target.reasons(self.problem, None, p)
            if why:
                self._skip(p, why)
            else:
                self.live.append(p)
                self.samples[p] = []
        if not self.live:
            self.record.reasons = [f"{p}: {self.results[p].reason}" for p in self.passes]
        return bool(self.live)

    def build_mask(self, sample: int) -> AttnMask | None:
        """Mask sample ``sample`` (timed as setup; the same verdict on every rank), or None."""
        built = build_mask_sample(self.cell, self.seqlen, sample, self.target.world)
        if built.failure is not None:
            failure = built.failure
            self.record.status = "error"
            self.record.error_type, self.record.error_msg = failure.error_type, failure.error_msg
            self.record.reasons.append(failure.reason)
            return None
        assert built.ms is not None
        self.setup_mask_ms.append(built.ms)
        return built.mask

    def mask_skips(self, mask: AttnMask) -> bool:
        """Record the first sample's mask and skip what it rules out; whether anything is left."""
        fill_mask_fields(self.record, mask)
        for p in list(self.live):
            why = self.target.reasons(self.problem, mask, p)
            if why:
                self._skip(p, why)
                self.live.remove(p)
                self.samples.pop(p)
        return bool(self.live)

    def prepare(
        self, mask: AttnMask, source: SeededInputs, sample: int
    ) -> tuple[PreparedAttention, Tensors] | None:
        """Setup (timed), this rank's inputs and the first sample's first call; None on failure."""
        try:
            start = time.perf_counter()
            prepared = self.target.prepare(mask, self.problem)
            self.setup_prepare_ms.append((time.perf_counter() - start) * 1e3)
            native = self.target.inputs(prepared, source)
            if sample == 0:
                start = time.perf_counter()
                with torch.no_grad():
                    prepared.run(native["q"], native["k"], native["v"])
                if self.problem.device_type == "cuda":
                    torch.cuda.synchronize()
                self.record.setup_first_call_ms = (time.perf_counter() - start) * 1e3
        except Exception as err:
            if self.collective:
                raise
            if not is_oom(err):
                self.record.reasons.append(traceback.format_exc(limit=3)[-800:])
            for p in list(self.live):
                self._fail(p, err, "setup failed: ")
            return None
        return prepared, native

    def measure_pass(
        self,
        pass_: str,
        mask: AttnMask,
        prepared: PreparedAttention,
        native: Tensors,
        profile: bool = False,
    ) -> None:
        """Time one pass on one sample (and trace it); failures end the pass."""
        target, problem = self.target, self.problem
        try:
            fn, before_each, _ = pass_callable(pass_, prepared, native)
            flush = None  # made before the measured region and left out of it
            if problem.device_type == "cuda" and self.timing.flush_l2:
                flush = l2_flush_buffer(problem.torch_device)
            excluded = 0 if flush is None else flush.numel() * flush.element_size()
            memory: PeakMemory | nullcontext[None] = nullcontext()
            if self.cell.bench.memory:
                memory = PeakMemory(problem.torch_device, exclude_bytes=excluded)
            sampler = self.telemetry.sampler()
            with memory:
                timing = measure(
                    fn,
                    self.timing,
                    device=problem.torch_device,
                    before_each=before_each,
                    barrier=target.barrier if self.collective else None,
                    agree=target.share,
                    flush_buffer=flush,
                    watch=sampler,
                )
            del flush
            telemetry = None
            if self.telemetry.source is not None:  # every rank has one, or none has
                energy = self.telemetry.energy_window(
                    sampler,
                    timing.q(0.5),
                    partial(repeat, fn, before_each=before_each, device=problem.torch_device),
                    target.share,
                )
                telemetry = self.telemetry.after(sampler, energy)
            reading = memory.reading if isinstance(memory, PeakMemory) else None
            if reading is not None:
                reading = target.largest_reading(reading)
            rank_p50 = target.gather(timing.q(0.5))
            slowest = target.reduce_times(list(timing.times_ms))  # the step is the slowest rank's
            timing = replace(
                timing,
                times_ms=tuple(slowest),
                quantiles_ms=quantiles(slowest, self.timing.quantiles),
            )
            self.samples[pass_].append(
                SampleMeasure(
                    timing=timing,
                    rank_p50=rank_p50,
                    flops=attention_flops(mask, problem.heads_q, problem.head_dim, as_pass(pass_)),
                    dense_flops=dense_flops(
                        self.seqlen, self.seqlen, problem.heads_q, problem.head_dim, as_pass(pass_)
                    ),
                    memory=reading,
                    telemetry=telemetry,
                )
            )
            backend = getattr(prepared, "backend_used", None)
            if backend is not None:  # chosen at run time (SDPA on CUDA): the record names it
                self.results[pass_].backend = str(backend)
            if profile:
                self._profile(pass_, fn, before_each)
            del fn, before_each
        except Exception as err:
            if self.collective:
                raise  # peers wait inside collectives with this rank
            self._fail(pass_, err)

    def run_sample(
        self, sample: int, mask: AttnMask, on_progress: Callable[[str], None] | None
    ) -> None:
        """Setup and every live pass on one mask sample."""
        cell, target = self.cell, self.target
        source = SeededInputs(cell.seed, self.seqlen, sample, self.problem)
        ready = self.prepare(mask, source, sample)
        if ready is None:
            return
        prepared, native = ready
        for p in list(self.live):
            if on_progress:
                on_progress(f"S={self.seqlen:,} {p} mask {sample + 1}/{cell.mask_samples}")
            self.measure_pass(p, mask, prepared, native, sample == 0 and cell.bench.profile)
        if sample == 0 and cell.bench.check_numerics and self.live and self.check.allowed():
            reference = self.check.reference(mask, source)
            for p in list(self.live):
                self.check.run(p, prepared, native, reference)
            del reference
        if sample == 0 and self.collective and self.live:
            target.describe(self.record, prepared, native, any(p != "fwd" for p in self.live))
        del prepared, native
        gc.collect()

    def finalise(self) -> RunRecord:
        """Summaries, numerics verdicts, setup medians, reasons and the record's status."""
        record, tol = self.record, self.tolerance
        if self.cell.bench.check_numerics:
            self.check.finalise(tol)
        for p, samples in self.samples.items():
            result = self.results[p]
            summarise(result, samples, self.target.world)
            self.telemetry.fill(record, p, [s.telemetry for s in samples if s.telemetry])
            worst_err = result.max_abs_err
            if worst_err is not None and not worst_err <= tol:
                errors = result.errors or {}
                result.status = "numerics_mismatch"
                worst = max(errors, key=errors.__getitem__)
                result.reason = f"{worst} error {worst_err:.3g} > tolerance {tol:g}"
        record.setup_mask_ms = statistics.median(self.setup_mask_ms) if self.setup_mask_ms else None
        record.setup_prepare_ms = (
            statistics.median(self.setup_prepare_ms) if self.setup_prepare_ms else None
        )
        record.reasons.extend(
            f"{p}: {self.results[p].reason}"
            for p in self.passes
            if self.results[p].reason is not None
        )
        record.finalise_status()
        return record

    def _profile(
        self, pass_: str, fn: Callable[[], object], before_each: Callable[[], None] | None
    ) -> None:
        """Trace extra repetitions of the pass; a failed trace is a reason, not a failed pass."""
        target = self.target
        path = trace_path(self.cell.job.output_dir, self.seqlen, pass_, target.rank)
        try:
            profile_pass(
                fn,
                label=f"lcab.{pass_}",
                reps=self.cell.bench.profile_reps,
                device=self.problem.torch_device,
                path=path,
                before_each=before_each,
                barrier=target.barrier if self.collective else None,
            )
        except Exception as err:
            if self.collective:
                raise  # peers may be inside a collective of the traced loop
            self.record.reasons.append(f"{pass_}: profiler trace failed: {short_error(err, 200)}")

    def _fail(self, pass_: str, err: Exception, prefix: str = "") -> None:
        """End a live pass on ``err`` (``oom`` or ``error``), naming it in the record."""
        self.results[pass_].status = "oom" if is_oom(err) else "error"
        self.results[pass_].reason = prefix + short_error(err, 300)
        self.record.error_type, self.record.error_msg = type(err).__name__, short_error(err)
        self.live.remove(pass_)
        self.samples.pop(pass_)

    def _skip(self, pass_: str, why: list[str]) -> None:
        self.results[pass_].status, self.results[pass_].reason = "skipped", "; ".join(why)


def run_seqlen(
    cell: Cell,
    target: Target,
    seqlen: int,
    env: dict[str, Any],
    on_progress: Callable[[str], None] | None = None,
) -> RunRecord:
    """Measure every requested pass of one (cell, seqlen); never raises for kernel failures."""
    run = _LengthRun(cell, target, seqlen, env)
    if not run.static_skips():
        run.record.finalise_status()
        return run.record
    for sample in range(cell.mask_samples):
        mask = run.build_mask(sample)
        if mask is None:
            return run.record
        if sample == 0 and target.rank == 0 and seqlen == max(cell.seqlens):
            save_mask_picture_of(cell, mask, run.record)
        if sample == 0 and not run.mask_skips(mask):
            break
        run.run_sample(sample, mask, on_progress)
        if not run.live:
            break
    return run.finalise()


def run_cell(
    cell: Cell,
    target: Target,
    emit: Callable[[RunRecord], None],
    on_progress: Callable[[str], None] | None = None,
) -> None:
    """Run every length of ``cell``; rank 0 emits one record per length as soon as it is done."""
    env = environment(cell.device)
    for seqlen in cell.seqlens:
        start = host_load.snapshot()
        try:
            record = run_seqlen(cell, target, seqlen, env, on_progress)
        except Exception as err:  # a bug in lcab itself: still a record
            if target.world > 1:
                raise  # under CP the supervisor records it (peers are mid-collective)
            record = base_record(cell, seqlen, env)
            record.status = "oom" if is_oom(err) else "error"
            record.error_type, record.error_msg = type(err).__name__, short_error(err)
            record.reasons = [traceback.format_exc(limit=4)[-1200:]]
        package = KERNELS.get(cell.kernel).caps.package  # imported by now, if it ran
        fields = host_load.load_fields(start, host_load.snapshot()) | kernel_provenance(package)
        for key, value in fields.items():
            setattr(record, key, value)
        if target.rank == 0:
            emit(record)
        if torch.cuda.is_available() and cell.device == "cuda":
            # cached blocks would make the next length's peak depend on the order of lengths
            gc.collect()
            torch.cuda.empty_cache()
