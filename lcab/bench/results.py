"""From measurements to a `RunRecord`: identity, mask fields, failures and per-pass summaries.

Each mask sample gives one `SampleMeasure` per pass; `summarise` combines them (medians, spread
kept). Failures are classified here, so the runner and the supervisor word them alike.
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from lcab.bench.memory import MemoryReading
from lcab.bench.pass_telemetry import PassTelemetry
from lcab.bench.timing import Timing
from lcab.cell import Cell
from lcab.flops import FLOP_CONVENTION, tflops_per_s
from lcab.lazy import lazy_module
from lcab.masks import AttnMask
from lcab.records.resume import NOT_RUN
from lcab.records.schema import MAX_KEPT_REPS, PassResult, RunRecord

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

OOM_WORDS = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "memoryerror",
    "can't start new thread",
)
"""How a failed allocation reads (CUDA, the host allocator, MemoryError, a thread's stack)."""
NULL_WITHOUT_ERROR = "error return without exception set"
"""CPython's SystemError of a C function failing silently: under a memory budget, a NULL malloc."""

MAX_LISTED_DOCS = 512
"""Documents listed in a record before only their digest is kept."""


@dataclass(frozen=True)
class SampleMeasure:
    """One pass measured on one mask sample."""

    timing: Timing
    """Per-repetition times (under CP: the slowest rank's, repetition by repetition)."""
    rank_p50: list[float]
    """Each rank's own median time (one entry on a single device)."""
    flops: int
    """Useful FLOPs of the pass on this sample (`lcab.flops`)."""
    dense_flops: int
    memory: MemoryReading | None = None
    """Peak memory over the timed region (None when ``bench.memory`` is off)."""
    telemetry: PassTelemetry | None = None
    """Clocks, power and energy over the repetitions, every rank's (None: telemetry off)."""


def is_oom(err: BaseException) -> bool:
    """Whether an exception is an out-of-memory failure (CUDA or host)."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(err).lower()
    if isinstance(err, SystemError) and NULL_WITHOUT_ERROR in text:
        return _data_limited()  # met in torch's backward at a CPU budget; a bug elsewhere
    return any(words in text for words in OOM_WORDS)


def _data_limited() -> bool:
    """Whether this process runs under ``RLIMIT_DATA`` (a rank held to a CPU memory budget)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return False
    return resource.getrlimit(resource.RLIMIT_DATA)[0] != resource.RLIM_INFINITY


def short_error(err: BaseException, limit: int = 500) -> str:
    """``Type: message``, cut to ``limit`` characters for a record."""
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
        passes=list(cell.bench.passes),
        mask_params=dict(cell.mask_params),
        mask_seed=cell.mask_seed,
        mask_samples=cell.mask_samples,
        flop_convention=FLOP_CONVENTION,
        cp_params=dict(cell.cp_options) if cell.cp != "none" else {},
        config=cell.config,
        **env,
    )


def fill_mask_fields(record: RunRecord, mask: AttnMask) -> None:
    """Area, density, parameters and documents of the first mask sample."""
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


def _median_quantile(samples: list[SampleMeasure], quantile: float) -> float | None:
    if not all(quantile in s.timing.quantiles_ms for s in samples):
        return None
    return statistics.median(s.timing.q(quantile) for s in samples)


def summarise(result: PassResult, samples: list[SampleMeasure], world: int) -> None:
    """Combine mask samples: medians of per-sample figures, spread kept."""
    if not samples:
        return
    p50 = [s.timing.q(0.5) for s in samples]
    result.status = "ok"
    result.ms_p50 = statistics.median(p50)
    result.ms_p20 = _median_quantile(samples, 0.2)
    result.ms_p80 = _median_quantile(samples, 0.8)
    result.ms_samples = p50 if len(samples) > 1 else None
    result.reps = len(samples[0].timing.times_ms)
    reps = [t for s in samples for t in s.timing.times_ms]
    step = max(1.0, len(reps) / MAX_KEPT_REPS)  # evenly thinned, in the order they ran
    kept = min(len(reps), MAX_KEPT_REPS)
    result.ms_reps = [float(f"{reps[int(i * step)]:.6g}") for i in range(kept)]
    result.flops = int(statistics.median(s.flops for s in samples))
    result.tflops = statistics.median(
        tflops_per_s(s.flops, s.timing.q(0.5) / 1e3) / world for s in samples
    )
    result.tflops_dense = statistics.median(
        tflops_per_s(s.dense_flops, s.timing.q(0.5) / 1e3) / world for s in samples
    )
    rank_p50 = samples[0].rank_p50
    if world > 1:
        result.rank_ms_p50 = rank_p50
        mean_rank = sum(rank_p50) / len(rank_p50)
        result.tflops_mean_rank = tflops_per_s(result.flops, mean_rank / 1e3) / world
    readings = [s.memory for s in samples if s.memory is not None]
    if readings:
        top = max(readings, key=lambda r: r.peak_bytes)
        result.mem_peak_mib = top.peak_bytes / 2**20
        result.mem_peak_rank = top.rank
        result.mem_delta_mib = max(r.delta_bytes for r in readings) / 2**20
        reserved = [r.reserved_bytes for r in readings if r.reserved_bytes is not None]
        result.mem_reserved_mib = max(reserved) / 2**20 if reserved else None


def unfinished_records(
    cell: Cell, pending: list[int], status: str, reason: str, env: dict[str, Any]
) -> list[RunRecord]:
    """Records for the lengths a cell did not finish: the first ``status``, the rest not run."""
    out = []
    for i, seqlen in enumerate(pending):
        this_status = status if i == 0 else "skipped"
        this_reason = reason if i == 0 else f"{NOT_RUN}seqlen {pending[0]} ended in {status}"
        record = base_record(cell, seqlen, env)
        record.status, record.reasons = this_status, [this_reason]
        for p in record.passes:
            record.pass_result(p).status = this_status
            record.pass_result(p).reason = this_reason
        out.append(record)
    return out


def refused_records(cell: Cell, reason: str, env: dict[str, Any]) -> list[RunRecord]:
    """A ``skipped`` record per length of a cell refused before any rank started."""
    out = []
    for seqlen in cell.seqlens:
        record = base_record(cell, seqlen, env)
        record.reasons = [f"{p}: {reason}" for p in record.passes]
        for p in record.passes:
            record.pass_result(p).reason = reason
        record.finalise_status()
        out.append(record)
    return out
