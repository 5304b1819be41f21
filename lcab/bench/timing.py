"""Timing protocol: exactly one call per timed repetition, quantiles over the repetitions.

After triton's ``do_bench`` (re-written here): one untimed call, a warm-up (a count, or a budget
estimated from at most five probe calls), then the timed repetitions, each with ``before_each``, the
CUDA L2 flush and ``barrier`` untimed around one ``fn()``: one call per repetition makes the
quantiles a distribution of call times and lets a barrier align ranks before each. In budget mode
under CP every count is rank 0's (``agree``): ranks picking different counts would hang NCCL. Clocks
and figures: the guide, ``lcab/bench/README.md`` ("Measurement protocol").
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


L2_FLUSH_BYTES = 256 * 1024 * 1024
"""Size of the buffer zeroed before every CUDA rep; larger than any current GPU's L2."""

_PROBE_CALLS = 5
_MIN_ESTIMATE_MS = 1e-3  # floor on the per-call estimate: a zero estimate must not divide


@dataclass(frozen=True)
class TimingConfig:
    """How many calls to warm up and time; counts by default, time budgets when set."""

    warmup: int = 3
    reps: int = 10
    warmup_ms: float | None = None
    rep_ms: float | None = None
    max_reps: int = 1000
    quantiles: tuple[float, ...] = (0.5, 0.2, 0.8)
    flush_l2: bool = True

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.reps < 1:
            raise ValueError(f"reps must be >= 1, got {self.reps}")
        if self.max_reps < 1:
            raise ValueError(f"max_reps must be >= 1, got {self.max_reps}")
        for name in ("warmup_ms", "rep_ms"):
            budget = getattr(self, name)
            if budget is not None and not budget > 0:  # also rejects NaN
                raise ValueError(f"{name} must be > 0 when set, got {budget}")
        if not self.quantiles or not all(0.0 <= q <= 1.0 for q in self.quantiles):
            raise ValueError(f"quantiles must be a non-empty tuple in [0, 1], got {self.quantiles}")


@dataclass(frozen=True)
class Timing:
    """Times of the timed repetitions (after ``reduce``), in milliseconds, and their quantiles."""

    times_ms: tuple[float, ...]
    quantiles_ms: dict[float, float] = field(hash=False)
    warmup: int
    clock: str

    @property
    def reps(self) -> int:
        """Number of timed repetitions."""
        return len(self.times_ms)

    def q(self, quantile: float) -> float:
        """Time (ms) at ``quantile``; computed from ``times_ms`` if it was not configured."""
        found = self.quantiles_ms.get(quantile)
        if found is not None:
            return found
        return quantiles(self.times_ms, (quantile,))[quantile]

    @property
    def p50(self) -> float:
        """Median time (ms)."""
        return self.q(0.5)


def quantiles(values: Sequence[float], qs: Sequence[float]) -> dict[float, float]:
    """Quantiles by linear interpolation between order statistics (numpy's default method).

    Written out so the hot path imports no numpy; interpolated as numpy's ``_lerp`` does (from
    the upper neighbour when the fraction is >= 0.5, for the same rounding).
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantiles of an empty sequence")
    last = len(ordered) - 1
    out: dict[float, float] = {}
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        pos = q * last
        lo = math.floor(pos)
        hi = min(lo + 1, last)
        frac = pos - lo
        a, b = ordered[lo], ordered[hi]
        out[q] = b - (b - a) * (1.0 - frac) if frac >= 0.5 else a + (b - a) * frac
    return out


def measure(
    fn: Callable[[], object],
    config: TimingConfig,
    *,
    device: torch.device,
    before_each: Callable[[], None] | None = None,
    barrier: Callable[[], None] | None = None,
    agree: Callable[[list[float]], list[float]] | None = None,
    flush_buffer: torch.Tensor | None = None,
    watch: AbstractContextManager[object] | None = None,
) -> Timing:
    """Time ``fn`` following the protocol in the module docstring.

    ``before_each`` and ``barrier`` run untimed before every timed repetition (not in warm-up);
    ``agree`` shares budget mode's counts; ``flush_buffer`` is the caller's L2-flush buffer,
    made outside a memory-measured region; ``watch`` (the telemetry sampler) is entered just
    before the first timed repetition and left once the last has finished on the device.
    """
    share = agree or (lambda values: values)  # one rank decides for itself
    device = torch.device(device)
    cuda = _is_cuda(device)
    with torch.cuda.device(device) if cuda else contextlib.nullcontext():
        if cuda:
            torch.cuda.synchronize(device)  # the caller's pending work is not ours to time
        first_ms = _block_ms(fn, 1, cuda)
        warmup, per_call_ms = _warm_up(fn, config, cuda, first_ms, share)
        reps = config.reps
        if config.rep_ms is not None:
            reps = int(share([_budget_reps(config.rep_ms, per_call_ms, config.max_reps)])[0])
        cache = None
        if cuda and config.flush_l2:
            cache = flush_buffer if flush_buffer is not None else l2_flush_buffer(device)
        with watch if watch is not None else contextlib.nullcontext():
            if cuda:
                raw = _timed_reps_cuda(fn, reps, before_each, barrier, cache)
            else:
                raw = _timed_reps_host(fn, reps, before_each, barrier)
    return Timing(
        times_ms=tuple(raw),
        quantiles_ms=quantiles(raw, config.quantiles),
        warmup=warmup,
        clock="cuda_event" if cuda else "perf_counter",
    )


def _is_cuda(device: torch.device) -> bool:
    """Whether ``device`` is timed with CUDA events; only CPU and CUDA have a correct clock here."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"cannot time on {device}: CUDA is not available")
        return True
    if device.type == "cpu":
        return False
    raise ValueError(f"no clock for device type {device.type!r}: lcab times 'cpu' and 'cuda'")


def _block_ms(fn: Callable[[], object], calls: int, cuda: bool) -> float:
    """Milliseconds for ``calls`` back-to-back calls, finished on the device."""
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / 1e6


def _warm_up(
    fn: Callable[[], object],
    config: TimingConfig,
    cuda: bool,
    first_ms: float,
    share: Callable[[list[float]], list[float]],
) -> tuple[int, float]:
    """Run the warm-up; return (calls made, per-call estimate in ms for budget mode).

    Without warm-up calls the estimate is the first (cold) call's: an over-estimate, so a rep
    budget yields fewer reps, never a longer run.
    """
    if config.warmup_ms is None:
        if config.warmup == 0:
            return 0, first_ms
        return config.warmup, _block_ms(fn, config.warmup, cuda) / config.warmup
    spent, calls = 0.0, 0
    # stop early for slow fns; the decision to take another probe call is shared
    while calls < _PROBE_CALLS and share([float(spent < config.warmup_ms)])[0] > 0:
        spent += _block_ms(fn, 1, cuda)
        calls += 1
    estimate = max(spent / max(calls, 1), _MIN_ESTIMATE_MS)
    remaining = max(0, math.ceil((config.warmup_ms - spent) / estimate))
    remaining = int(share([float(remaining)])[0])
    if remaining:
        estimate = max(_block_ms(fn, remaining, cuda) / remaining, _MIN_ESTIMATE_MS)
    return calls + remaining, estimate


def _budget_reps(rep_ms: float, per_call_ms: float, max_reps: int) -> int:
    """Reps that fill ``rep_ms`` at ``per_call_ms`` each, clamped to ``[1, max_reps]``."""
    wanted = round(rep_ms / max(per_call_ms, _MIN_ESTIMATE_MS))
    return min(max(wanted, 1), max_reps)


def _timed_reps_host(
    fn: Callable[[], object],
    reps: int,
    before_each: Callable[[], None] | None,
    barrier: Callable[[], None] | None,
) -> list[float]:
    """Per-rep ms on the host clock; the loop is kept minimal because its cost is the overhead."""
    clock = time.perf_counter_ns
    elapsed = [0] * reps
    for i in range(reps):
        if before_each is not None:
            before_each()
        if barrier is not None:
            barrier()
        start = clock()
        fn()
        elapsed[i] = clock() - start
    return [ns / 1e6 for ns in elapsed]


def _timed_reps_cuda(
    fn: Callable[[], object],
    reps: int,
    before_each: Callable[[], None] | None,
    barrier: Callable[[], None] | None,
    cache: torch.Tensor | None,
) -> list[float]:
    """Per-rep ms from CUDA event pairs; events are created up front, read after one sync."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if before_each is not None:
            before_each()
        if cache is not None:
            cache.zero_()
        if barrier is not None:
            barrier()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]


def repeat(
    fn: Callable[[], object],
    calls: int,
    before_each: Callable[[], None] | None,
    device: torch.device,
) -> None:
    """``calls`` untimed calls back to back, no L2 flush nor barrier: an energy window."""
    for _ in range(calls):
        if before_each is not None:
            before_each()
        fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """The buffer zeroed before each CUDA rep (make it outside a memory-measured region)."""
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
