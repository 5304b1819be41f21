"""Run one cell on one rank: for each length, masks → setup → timed passes → numerics → record.

Nothing here raises for a failing kernel: unsupported passes become ``skipped`` with reasons
(static checks first, so a skip costs milliseconds), an out-of-memory error ``oom``, any other
exception ``error`` with its type and message, and a result off the fp64 reference
``numerics_mismatch`` (with its timing kept). The supervisor adds ``timeout`` and crash records.

The runner talks to a `Target` — a single kernel here, a context-parallel strategy wrapping a
kernel in `lcab.cp` — so single-device and distributed cells share one protocol.
"""

from __future__ import annotations

import gc
import hashlib
import statistics
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

import torch

from lcab.bench.environment import environment
from lcab.bench.memory import PeakMemory
from lcab.bench.numerics import lse_error, normalised_error, tolerance
from lcab.bench.timing import Timing, TimingConfig, measure, quantiles
from lcab.cell import Cell
from lcab.flops import FLOP_CONVENTION, as_pass, attention_flops, dense_flops, tflops_per_s
from lcab.kernels import Kernel, PreparedAttention, Problem, get_kernel
from lcab.kernels.reference import reference_rows, sample_rows
from lcab.masks import AttnMask, make_mask
from lcab.records.schema import PassResult, RunRecord

#: Documents listed in a record before only their digest is kept.
MAX_LISTED_DOCS = 512


class Target(Protocol):
    """What runs the attention: a kernel, or a CP strategy around one."""

    rank: int
    world: int

    def reasons(self, problem: Problem, mask: AttnMask | None, pass_: str) -> list[str]:
        """Why ``pass_`` cannot run (empty: it can)."""

    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        """Setup for one mask (timed as setup)."""

    def barrier(self) -> None:
        """Synchronise ranks before a repetition (no-op on one device)."""

    def reduce_times(self, times: list[float]) -> list[float]:
        """Per-repetition times as the slowest rank saw them."""

    def describe(
        self,
        record: RunRecord,
        prepared: PreparedAttention,
        native: dict[str, torch.Tensor],
        backward: bool,
    ) -> None:
        """Distributed fields (comm bytes, phases, balance) from one untimed call."""

    def extra_record_fields(self, record: RunRecord, mask: AttnMask) -> None:
        """Fill target-specific fields for the first mask sample."""

    def gather(self, value: float) -> list[float]:
        """Every rank's ``value`` (rank order)."""


@dataclass
class KernelTarget:
    """A single-device target: the kernel itself."""

    kernel: Kernel
    rank: int = 0
    world: int = 1

    def reasons(self, problem: Problem, mask: AttnMask | None, pass_: str) -> list[str]:  # noqa: D102
        return self.kernel.not_supported_reasons(problem, mask, pass_)

    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:  # noqa: D102
        return self.kernel.prepare(mask, problem)

    def barrier(self) -> None:  # noqa: D102
        return None

    def reduce_times(self, times: list[float]) -> list[float]:  # noqa: D102
        return times

    def extra_record_fields(self, record: RunRecord, mask: AttnMask) -> None:  # noqa: D102
        return None

    def gather(self, value: float) -> list[float]:  # noqa: D102
        return [value]

    def describe(  # noqa: D102
        self,
        record: RunRecord,
        prepared: PreparedAttention,
        native: dict[str, torch.Tensor],
        backward: bool,
    ) -> None:
        return None


def is_oom(err: BaseException) -> bool:
    """Whether an exception is an out-of-memory failure (CUDA or host)."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(err).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _short(err: BaseException, limit: int = 500) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def base_record(cell: Cell, seqlen: int, env: dict[str, Any]) -> RunRecord:
    """A record with identity, axes and environment filled in."""
    index = cell.seqlens.index(seqlen)
    return RunRecord(
        run_id=f"{cell.job.run_id}-{seqlen}" if cell.job.run_id else str(seqlen),
        sweep_id=cell.job.sweep_id,
        job_num=cell.job.job_num,
        override_dirname=cell.job.override_dirname,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        kernel=cell.kernel,
        cp=cell.cp,
        mask=cell.mask,
        seqlen=seqlen,
        seqlen_per_device=cell.seqlen_per_device[index] if cell.seqlen_per_device else None,
        world_size=cell.world_size,
        nodes=cell.nodes,
        devices_per_node=cell.devices_per_node,
        heads_q=cell.heads_q,
        heads_kv=cell.heads_kv,
        head_dim=cell.head_dim,
        dtype=cell.dtype,
        device=cell.device,
        passes=list(cell.bench["passes"]),
        mask_params=dict(cell.mask_params),
        mask_seed=cell.mask_seed,
        mask_samples=cell.mask_samples,
        flop_convention=FLOP_CONVENTION,
        cp_params=dict(cell.cp_options) if cell.cp != "none" else {},
        config=cell.config,
        **env,
    )


def _inputs(cell: Cell, seqlen: int, sample: int, problem: Problem) -> dict[str, torch.Tensor]:
    """Seeded q, k, v, dout (packed); identical on every rank."""
    gen = torch.Generator().manual_seed(hash((cell.seed, seqlen, sample)) % (1 << 62))
    shapes = {
        "q": (seqlen, problem.heads_q, problem.head_dim),
        "k": (seqlen, problem.heads_kv, problem.head_dim),
        "v": (seqlen, problem.heads_kv, problem.head_dim),
        "dout": (seqlen, problem.heads_q, problem.head_dim),
    }
    return {
        name: torch.randn(shape, generator=gen).to(dtype=problem.dtype, device=problem.device)
        for name, shape in shapes.items()
    }


def _pass_callable(
    pass_: str, prepared: PreparedAttention, native: dict[str, torch.Tensor]
) -> tuple[Callable[[], object], Callable[[], None] | None, list[torch.Tensor]]:
    """(timed fn, untimed before-each hook, leaves whose grads matter) for one pass."""
    q, k, v, dout = native["q"], native["k"], native["v"], native["dout"]
    if pass_ == "fwd":
        return (lambda: prepared.run(q, k, v)), None, []
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def zero() -> None:
        for t in leaves:
            t.grad = None

    if pass_ == "bwd":
        out, _ = prepared.run(*leaves)
        return (lambda: out.backward(dout, retain_graph=True)), zero, leaves

    def fwd_bwd() -> None:
        prepared.run(*leaves)[0].backward(dout)

    return fwd_bwd, zero, leaves


class _Reference:
    """Lazily computed fp64 reference for one (seqlen, mask sample 0)."""

    def __init__(
        self, mask: AttnMask, inputs: dict[str, torch.Tensor], full: bool, rows: int, seed: int
    ) -> None:
        self.mask, self.inputs, self.full = mask, inputs, full
        self.rows = None if full else sample_rows(mask.seqlen_q, rows, seed)
        self._fwd: tuple[torch.Tensor, torch.Tensor] | None = None
        self._grads: dict[str, torch.Tensor | None] | None = None

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fwd is None:
            self._compute()
        assert self._fwd is not None
        return self._fwd

    def grads(self) -> dict[str, torch.Tensor | None]:
        if self._grads is None:
            self._compute()
        assert self._grads is not None
        return self._grads

    def _compute(self) -> None:
        x = self.inputs
        if self.full:
            leaves = [x[n].detach().double().requires_grad_(True) for n in ("q", "k", "v")]
            out, lse = get_kernel("reference")(leaves[0], leaves[1], leaves[2], self.mask)
            assert lse is not None
            grads = torch.autograd.grad(out, leaves, x["dout"].double())
            self._fwd = (out.detach(), lse.detach())
            self._grads = {"dq": grads[0], "dk": grads[1], "dv": grads[2]}
        else:
            assert self.rows is not None
            out, lse, dq = reference_rows(
                x["q"], x["k"], x["v"], self.mask, self.rows, x["dout"][self.rows]
            )
            self._fwd = (out, lse)
            self._grads = {"dq": dq, "dk": None, "dv": None}


def _check(
    pass_: str,
    prepared: PreparedAttention,
    native: dict[str, torch.Tensor],
    reference: _Reference | None,
) -> dict[str, float] | None:
    """Normalised errors of one untimed call of ``pass_`` against the reference.

    Every rank makes the call (under CP it is collective, and so is ``from_native``); only the
    rank holding the reference compares, the others return None.
    """
    rows = reference.rows if reference is not None else None
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])
    if pass_ == "fwd":
        with torch.no_grad():
            out, lse = prepared.run(native["q"], native["k"], native["v"])
        out = prepared.from_native(out)
        lse = None if lse is None else prepared.lse_from_native(lse)
        if reference is None:
            return None
        ref_out, ref_lse = reference.forward()
        errors = {"out": normalised_error(pick(out), ref_out)}
        if lse is not None:
            lse_rows = lse if rows is None else lse[:, rows]
            errors["lse"] = lse_error(lse_rows, ref_lse)
        return errors
    leaves = [native[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v")]
    out, _ = prepared.run(*leaves)
    out.backward(native["dout"])
    grads = {
        name: None if leaf.grad is None else prepared.from_native(leaf.grad)
        for name, leaf in zip(("dq", "dk", "dv"), leaves, strict=True)
    }
    if reference is None:
        return None
    errors = {}
    for name, grad in grads.items():
        ref = reference.grads()[name]
        if grad is None:
            errors[name] = float("inf")
        elif ref is not None:
            errors[name] = normalised_error(pick(grad), ref)
    return errors


def _fill_mask_fields(record: RunRecord, mask: AttnMask) -> None:
    record.mask_area = mask.area()
    record.mask_density = mask.density()
    record.mask_params = dict(mask.params)
    if mask.doc_lengths is not None:
        lengths = [int(x) for x in mask.doc_lengths]
        record.num_docs = len(lengths)
        record.doc_lengths = lengths if len(lengths) <= MAX_LISTED_DOCS else None
        record.doc_lengths_digest = hashlib.sha256(
            ",".join(map(str, lengths)).encode()
        ).hexdigest()[:16]


def run_seqlen(
    cell: Cell,
    target: Target,
    seqlen: int,
    env: dict[str, Any],
    on_progress: Callable[[str], None] | None = None,
) -> RunRecord:
    """Measure every requested pass of one (cell, seqlen); never raises for kernel failures."""
    record = base_record(cell, seqlen, env)
    bench = cell.bench
    problem = Problem(
        seqlen,
        seqlen,
        cell.heads_q,
        cell.heads_kv,
        cell.head_dim,
        cell.torch_dtype,
        torch.device(cell.device),
    )
    passes: list[str] = list(bench["passes"])
    results = {p: record.pass_result(p) for p in passes}
    live = []
    for p in passes:  # static checks: no mask, no tensors, milliseconds
        why = target.reasons(problem, None, p)
        if why:
            results[p].status, results[p].reason = "skipped", "; ".join(why)
        else:
            live.append(p)
    if not live:
        record.reasons = [f"{p}: {results[p].reason}" for p in passes]
        record.finalise_status()
        return record

    timing_cfg = TimingConfig(
        warmup=int(bench["warmup"]),
        reps=int(bench["reps"]),
        warmup_ms=bench["warmup_ms"],
        rep_ms=bench["rep_ms"],
        max_reps=int(bench["max_reps"]),
        quantiles=tuple(bench["quantiles"]),
        flush_l2=bool(bench["flush_l2"]),
    )
    tol = tolerance(problem.dtype, bench["tolerance"])
    full_ref = cell.heads_q * seqlen * seqlen <= int(bench["numerics_full_max"])
    per_sample: dict[str, list[dict[str, Any]]] = {p: [] for p in live}
    setup_mask, setup_prepare = [], []
    for sample in range(cell.mask_samples):
        try:
            start = time.perf_counter()
            mask = make_mask(cell.mask, seqlen, seed=cell.mask_seed + sample, **cell.mask_params)
            setup_mask.append((time.perf_counter() - start) * 1e3)
        except Exception as err:
            record.status, record.error_type, record.error_msg = (
                "error",
                type(err).__name__,
                _short(err),
            )
            record.reasons.append(f"mask construction failed: {_short(err, 200)}")
            return record
        if sample == 0:
            _fill_mask_fields(record, mask)
            target.extra_record_fields(record, mask)
            for p in list(live):
                why = target.reasons(problem, mask, p)
                if why:
                    results[p].status, results[p].reason = "skipped", "; ".join(why)
                    live.remove(p)
                    per_sample.pop(p)
            if not live:
                break
        inputs = _inputs(cell, seqlen, sample, problem)
        try:
            start = time.perf_counter()
            prepared = target.prepare(mask, problem)
            setup_prepare.append((time.perf_counter() - start) * 1e3)
            native = {n: prepared.to_native(t) for n, t in inputs.items()}
            if sample == 0:
                start = time.perf_counter()
                with torch.no_grad():
                    prepared.run(native["q"], native["k"], native["v"])
                if problem.device.type == "cuda":
                    torch.cuda.synchronize()
                record.setup_first_call_ms = (time.perf_counter() - start) * 1e3
        except Exception as err:
            if target.world > 1:
                raise
            status = "oom" if is_oom(err) else "error"
            for p in live:
                results[p].status, results[p].reason = status, f"setup failed: {_short(err, 300)}"
            record.error_type, record.error_msg = type(err).__name__, _short(err)
            if status == "error":
                record.reasons.append(traceback.format_exc(limit=3)[-800:])
            live = []
            break
        check = sample == 0 and bool(bench["check_numerics"])
        reference = (
            _Reference(mask, inputs, full_ref, int(bench["numerics_rows"]), cell.seed)
            if check and target.rank == 0
            else None
        )
        for p in list(live):
            if on_progress:
                on_progress(f"S={seqlen:,} {p} mask {sample + 1}/{cell.mask_samples}")
            try:
                fn, before_each, _ = _pass_callable(p, prepared, native)
                memory = PeakMemory(problem.device) if bench["memory"] else nullcontext()
                with memory:
                    timing = measure(
                        fn,
                        timing_cfg,
                        device=problem.device,
                        before_each=before_each,
                        barrier=target.barrier if target.world > 1 else None,
                    )
                rank_p50 = [timing.q(0.5)]
                if target.world > 1:  # the step time is the slowest rank's
                    rank_p50 = target.gather(timing.q(0.5))
                    slowest = target.reduce_times(list(timing.times_ms))
                    timing = Timing(
                        tuple(slowest),
                        quantiles(slowest, timing_cfg.quantiles),
                        timing.warmup,
                        timing.clock,
                    )
                entry: dict[str, Any] = {
                    "rank_p50": rank_p50,
                    "timing": timing,
                    "flops": attention_flops(mask, problem.heads_q, problem.head_dim, as_pass(p)),
                    "dense": dense_flops(
                        seqlen, seqlen, problem.heads_q, problem.head_dim, as_pass(p)
                    ),
                }
                if isinstance(memory, PeakMemory):
                    entry["memory"] = memory.reading
                per_sample[p].append(entry)
                del fn, before_each
                if check:
                    errors = _check(p, prepared, native, reference)
                    if errors is not None:
                        results[p].errors = errors
                        results[p].max_abs_err = max(errors.values()) if errors else None
            except Exception as err:
                if target.world > 1:
                    # peers wait inside collectives with this rank: end the cell (the
                    # supervisor records it) rather than deadlock them
                    raise
                results[p].status = "oom" if is_oom(err) else "error"
                results[p].reason = _short(err, 300)
                record.error_type, record.error_msg = type(err).__name__, _short(err)
                live.remove(p)
                per_sample.pop(p)
        if sample == 0 and target.world > 1 and live:
            target.describe(record, prepared, native, any(p != "fwd" for p in live))
        del prepared, native, inputs
        gc.collect()

    if bench["check_numerics"]:
        record.numerics_mode = "full" if full_ref else "sampled"
        record.numerics_tolerance = tol
    for p, samples in per_sample.items():
        _summarise(results[p], samples, target.world)
        worst_err = results[p].max_abs_err
        if worst_err is not None and not worst_err <= tol:
            results[p].status = "numerics_mismatch"
            worst = max(results[p].errors or {}, key=lambda n: (results[p].errors or {})[n])
            results[p].reason = f"{worst} error {worst_err:.3g} > tolerance {tol:g}"
    record.setup_mask_ms = statistics.median(setup_mask) if setup_mask else None
    record.setup_prepare_ms = statistics.median(setup_prepare) if setup_prepare else None
    record.reasons.extend(
        f"{p}: {results[p].reason}" for p in passes if results[p].reason is not None
    )
    record.finalise_status()
    return record


def _summarise(result: PassResult, samples: list[dict[str, Any]], world: int) -> None:
    """Combine mask samples: medians of per-sample figures, spread kept."""
    if not samples:
        return
    p50 = [s["timing"].q(0.5) for s in samples]
    result.status = "ok"
    result.ms_p50 = statistics.median(p50)
    result.ms_p20 = (
        statistics.median(s["timing"].q(0.2) for s in samples)
        if all(0.2 in s["timing"].quantiles_ms for s in samples)
        else None
    )
    result.ms_p80 = (
        statistics.median(s["timing"].q(0.8) for s in samples)
        if all(0.8 in s["timing"].quantiles_ms for s in samples)
        else None
    )
    result.ms_samples = p50 if len(samples) > 1 else None
    result.reps = len(samples[0]["timing"].times_ms)
    result.flops = int(statistics.median(s["flops"] for s in samples))
    result.tflops = statistics.median(
        tflops_per_s(s["flops"], s["timing"].q(0.5) / 1e3) / world for s in samples
    )
    result.tflops_dense = statistics.median(
        tflops_per_s(s["dense"], s["timing"].q(0.5) / 1e3) / world for s in samples
    )
    rank_p50 = samples[0]["rank_p50"]
    if world > 1:
        result.rank_ms_p50 = rank_p50
        mean_rank = sum(rank_p50) / len(rank_p50)
        result.tflops_mean_rank = tflops_per_s(result.flops, mean_rank / 1e3) / world
    readings = [s["memory"] for s in samples if "memory" in s]
    if readings:
        result.mem_peak_mib = max(r.peak_bytes for r in readings) / 2**20
        result.mem_delta_mib = max(r.delta_bytes for r in readings) / 2**20


def run_cell(
    cell: Cell,
    target: Target,
    emit: Callable[[RunRecord], None],
    on_progress: Callable[[str], None] | None = None,
) -> None:
    """Run every length of ``cell``; rank 0 emits one record per length as soon as it is done."""
    env = environment(cell.device)
    for seqlen in cell.seqlens:
        try:
            record = run_seqlen(cell, target, seqlen, env, on_progress)
        except Exception as err:  # a bug in lcab itself: still a record
            if target.world > 1:
                raise  # under CP the supervisor records it (peers are mid-collective)
            record = base_record(cell, seqlen, env)
            record.status = "oom" if is_oom(err) else "error"
            record.error_type, record.error_msg = type(err).__name__, _short(err)
            record.reasons = [traceback.format_exc(limit=4)[-1200:]]
        if target.rank == 0:
            emit(record)


def kernel_target(cell: Cell) -> KernelTarget:
    """The single-device target of a cell."""
    return KernelTarget(get_kernel(cell.kernel, **cell.kernel_options))
