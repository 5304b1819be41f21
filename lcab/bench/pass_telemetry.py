"""A pass's telemetry in its record: per rank, over ranks, over mask samples, against the peak.

Ranks gather their figures as floats (NaN: not read), so every rank makes the same collectives,
whatever its device exposes. A share of the peak above 1 (1.5 of a CPU's measured ceiling) is
flagged ``peak_implausible`` with a reason, never silently reported. The rules: the guide,
``lcab/bench/README.md`` ("Measurement protocol").
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from lcab.bench import cpu_peak, host_load
from lcab.bench.telemetry import (
    ENERGY_ROUNDS,
    ENERGY_STEPS,
    Sampler,
    TelemetryReading,
    energy_calls,
)
from lcab.bench.telemetry_sources import HostSource, NvmlSource, Source
from lcab.peaks import is_implausible, lookup, peak_tflops, share_of_peak
from lcab.records.schema import PassResult, RunRecord

NAN = float("nan")
COLUMNS = 11
"""The figures of `rank_vector`."""


@dataclass(frozen=True)
class PassTelemetry:
    """One pass on one mask sample: every rank's readings combined (None: no rank read it)."""

    clock_mhz: tuple[float, float, float] | None = None
    """(lowest, median, highest) compute clock."""
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    power_w_max: float | None = None
    energy_j: float | None = None
    """One call's energy, the job's devices together."""
    temperature_c: float | None = None
    event_bits: int = 0
    clock_samples: int | None = None
    """Clock samples inside the timed window, the fewest of any rank's."""
    energy_window_s: float | None = None
    """The energy window's length, the longest of any rank's."""
    energy_calls: int | None = None
    power_over_limit: float | None = None
    """The highest of any rank's mean power over its device's enforced limit."""


def _float(value: float | None) -> float:
    return NAN if value is None else value


def rank_vector(reading: TelemetryReading | None, energy: TelemetryReading | None) -> list[float]:
    """One rank's figures as floats for a gather (NaN: not read)."""
    if reading is None:
        return [NAN] * COLUMNS
    clocks = reading.clocks() or (NAN, NAN, NAN)
    mem = reading.clocks("mem_clock_mhz")
    power = (energy or reading).power_w()
    joules = None if energy is None else energy.window_energy_j()
    per_call = (
        None if joules is None or energy is None or not energy.calls else joules / energy.calls
    )
    limit = reading.power_limit_w
    return [
        *clocks,
        mem[1] if mem else NAN,
        _float(power),
        _float(per_call),
        _float(reading.temperature_c()),
        float(reading.event_bits()),
        float(len(reading.inside())),
        _float(None if energy is None else energy.window_s),
        power / limit if power is not None and limit else NAN,
    ]


def over_ranks(vectors: Sequence[Sequence[float]], shared_counter: bool) -> PassTelemetry:
    """Combine every rank's `rank_vector` (the rules: the guide, "Measurement protocol")."""
    columns = list(zip(*vectors, strict=True)) if vectors else [()] * COLUMNS

    def read(i: int) -> list[float]:
        return [v for v in columns[i] if not math.isnan(v)]

    lows, medians, highs = read(0), read(1), read(2)
    clock = (min(lows), statistics.median(medians), max(highs)) if medians else None
    mem, power, energy, temperature = read(3), read(4), read(5), read(6)
    if energy:
        job_energy: float | None = max(energy) if shared_counter else sum(energy)
        if not shared_counter and len(energy) < len(vectors):
            job_energy = None  # a rank without a counter: the job's sum is unknown
    else:
        job_energy = None
    bits = 0
    for b in read(7):
        bits |= int(b)
    return PassTelemetry(
        clock_mhz=clock,
        mem_clock_mhz=statistics.median(mem) if mem else None,
        power_w=statistics.fmean(power) if power else None,
        power_w_max=max(power) if power else None,
        energy_j=job_energy,
        temperature_c=max(temperature) if temperature else None,
        event_bits=bits,
        clock_samples=int(min(read(8))) if read(8) else None,
        energy_window_s=max(read(9)) if read(9) else None,
        power_over_limit=max(read(10)) if read(10) else None,
    )


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def fill_telemetry(
    result: PassResult,
    samples: Sequence[PassTelemetry],
    tokens: int,
    event_names: Callable[[int], list[str]],
) -> None:
    """The pass's telemetry fields from its mask samples (after `summarise` set its FLOPs)."""
    clocks = [s.clock_mhz for s in samples if s.clock_mhz is not None]
    if clocks:
        result.clock_mhz_min = min(c[0] for c in clocks)
        result.clock_mhz_median = statistics.median(c[1] for c in clocks)
        result.clock_mhz_max = max(c[2] for c in clocks)
    result.mem_clock_mhz = _median([s.mem_clock_mhz for s in samples])
    result.power_w = _median([s.power_w for s in samples])
    highest = [s.power_w_max for s in samples if s.power_w_max is not None]
    result.power_w_max = max(highest) if highest else None
    result.energy_j = _median([s.energy_j for s in samples])
    if result.energy_j is not None and result.energy_j > 0:
        result.energy_j_per_token = result.energy_j / tokens if tokens else None
        if result.flops is not None:
            result.gflops_per_j = result.flops / result.energy_j / 1e9
    temperatures = [s.temperature_c for s in samples if s.temperature_c is not None]
    result.temperature_c = max(temperatures) if temperatures else None
    bits = 0
    for s in samples:
        bits |= s.event_bits
    result.clock_events = event_names(bits) if bits else None
    counts = [s.clock_samples for s in samples if s.clock_samples is not None]
    if counts:
        result.clock_samples = min(counts)
        result.clock_source = "inside the window" if result.clock_samples else "the window's ends"
    result.energy_window_s = _median([s.energy_window_s for s in samples])
    calls = _median([s.energy_calls for s in samples])
    result.energy_calls = None if calls is None else round(calls)


def fill_peak(record: RunRecord, pass_name: str, device_name: str | None) -> None:
    """The pass's share of its device's peak at the measured clock; flag one above it."""
    result = record.pass_result(pass_name)
    if device_name is None and record.device == "cpu":  # read by the host's files, not NVML
        fill_cpu_peak(record, pass_name)
        return
    if device_name is None or result.tflops is None or lookup(device_name) is None:
        return
    if record.shared_device:  # ranks shared a GPU: the times, so the rate, measure nothing
        return
    clock = result.clock_mhz_median if result.clock_samples else None  # none inside: idle ends
    if clock is not None and not (math.isfinite(clock) and clock > 0):
        clock = None  # a reading of 0 or NaN: the rated peak, unscaled
    peak = peak_tflops(device_name, record.dtype, clock)
    if peak is None:
        return
    result.peak_tflops = peak.tflops
    result.peak_share = share_of_peak(result.tflops, peak)
    result.peak_implausible = is_implausible(result.peak_share)
    how = "scaled to the measured clock" if peak.scaled else "at its rated clock: "
    if not peak.scaled:
        how += peak.note or "no clock sample fell inside the timed window"
    record.peak_basis = f"rated: {peak.gpu} {peak.dtype} {peak.unit}, {how}"
    if result.peak_implausible:
        at = f"{peak.clock_mhz:,.0f} MHz" if peak.clock_mhz else "its rated clock"
        record.reasons.append(
            f"{pass_name}: {result.tflops:,.1f} TFLOP/s is {result.peak_share:.0%} of the "
            f"{peak.gpu}'s {record.dtype} peak at {at} ({peak.tflops:,.1f}): "
            "implausible, the FLOP count or the timer is wrong"
        )


def fill_cpu_peak(record: RunRecord, pass_name: str) -> None:
    """The pass's share of its host's ceiling; flag one far above it."""
    result = record.pass_result(pass_name)
    if result.tflops is None or result.status != "ok":
        return
    ceiling = cpu_peak.cpu_ceiling(record.dtype)
    if ceiling is None:
        return
    result.peak_tflops = ceiling.tflops
    result.peak_share = result.tflops / ceiling.tflops
    result.peak_implausible = result.peak_share > cpu_peak.IMPLAUSIBLE_CPU_SHARE
    nominal = "?" if ceiling.nominal_tflops is None else f"{ceiling.nominal_tflops * 1e3:,.1f}"
    record.peak_basis = (
        f"measured: best {ceiling.dtype} matmul on {ceiling.threads} thread(s), CPU time, "
        f"{ceiling.measured_tflops * 1e3:,.1f} GFLOP/s; nominal FMA rate {nominal}"
    )
    load, cores = host_load.snapshot().load_1min, host_load.usable_cores()
    if load is not None and load > cores:  # the pass ran slower than the host can
        record.peak_basis += f"; host busy (load {load:.1f} on {cores} cores)"
    if result.peak_implausible:
        record.reasons.append(
            f"{pass_name}: {result.tflops * 1e3:,.1f} GFLOP/s is {result.peak_share:.1f}x this "
            f"host's ceiling on {ceiling.threads} thread(s) ({ceiling.tflops * 1e3:,.1f}): "
            "implausible, the FLOP count or the timer is wrong"
        )


_SOURCES: dict[tuple[str, int], Source] = {}
"""One source per device in a process: NVML is opened once, a CPU host's counters too."""


def device_source(mode: str, device_type: str, index: int | None) -> Source | None:
    """The source ``bench.telemetry`` asks for (None: off); on a CPU ``nvml`` reads LOCAL_RANK's."""
    if mode == "off":
        return None
    kind = ("nvml" if device_type == "cuda" else "host") if mode == "auto" else mode
    if kind == "host":
        return _SOURCES.setdefault(("host", 0), HostSource())
    if index is None:
        index = int(os.environ.get("LOCAL_RANK", "0"))
    key = ("nvml", index)
    if key not in _SOURCES:
        uuid = None
        if device_type == "cuda":
            import torch

            uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "")) or None
        _SOURCES[key] = NvmlSource(index, uuid)
    return _SOURCES[key]


class LengthTelemetry:
    """One length's telemetry: a sampler around each pass's repetitions, the ranks gathered."""

    def __init__(
        self,
        source: Source | None,
        interval_ms: float | None,
        gather: Callable[[float], list[float]] | None,
        shared_counter: bool,
    ) -> None:
        self.source, self.interval_ms = source, interval_ms
        self.gather, self.shared_counter = gather, shared_counter
        self.notes: list[str] = []
        self.device_name: str | None = None
        self.power_limit_w: float | None = None

    def sampler(self) -> Sampler | None:
        """A sampler for the next pass's repetitions (None when telemetry is off)."""
        return None if self.source is None else Sampler(self.source, self.interval_ms)

    def energy_window(
        self,
        timed: Sampler | None,
        per_call_ms: float,
        run: Callable[[int], None],
        agree: Callable[[list[float]], list[float]] | None,
    ) -> Sampler | None:
        """The pass's energy window: rounds of ``run(calls)``, every rank runs rank 0's counts."""
        if self.source is None:
            return None
        counter = timed is not None and timed.reading.energy_j is not None
        calls = energy_calls(self.source, per_call_ms) if counter else 0
        share = agree or (lambda values: values)
        calls = int(share([float(calls)])[0])
        if not calls:
            return None
        window, done = Sampler(self.source), 0
        with window:
            start = time.perf_counter()
            for _ in range(ENERGY_ROUNDS):
                run(calls)
                done += calls
                spent_ms = (time.perf_counter() - start) * 1e3
                calls = int(share([float(energy_calls(self.source, spent_ms / done, spent_ms))])[0])
                if not calls:
                    break
        window.reading.calls = done
        return window

    def after(self, sampler: Sampler | None, energy: Sampler | None = None) -> PassTelemetry:
        """The pass's figures over every rank (every rank calls this: it gathers)."""
        reading = None if sampler is None else sampler.reading
        window = None if energy is None else energy.reading
        for read in (reading, window):
            if read is not None:
                self.device_name = self.device_name or read.device_name
                self.power_limit_w = self.power_limit_w or read.power_limit_w
                self.notes += [n for n in read.notes if n not in self.notes]
        if window is not None and window.energy_j is not None and window.window_energy_j() is None:
            note = (
                f"energy left empty: a window under the {window.energy_min_s:g} s its counter needs"
            )
            self.notes += [note] if note not in self.notes else []
        mine = rank_vector(reading, window)
        vectors = [mine]
        if self.gather is not None:
            columns = [self.gather(value) for value in mine]
            vectors = [list(v) for v in zip(*columns, strict=True)]
        combined = over_ranks(vectors, self.shared_counter or self.source is None)
        return replace(combined, energy_calls=None if window is None else window.calls)

    def fill(self, record: RunRecord, pass_name: str, samples: Sequence[PassTelemetry]) -> None:
        """The pass's record fields; the record's source, device and notes."""
        if self.source is None:
            return
        record.telemetry_source = self.source.kind
        record.telemetry_device = self.device_name
        record.telemetry_power_limit_w = self.power_limit_w
        record.telemetry_note = "; ".join(self.notes) or None
        fill_telemetry(record.pass_result(pass_name), samples, record.seqlen, self._names)
        over = [s.power_over_limit for s in samples if s.power_over_limit is not None]
        if over and max(over) > 1 + 1 / ENERGY_STEPS:  # beyond the counter's resolution
            record.reasons.append(
                f"{pass_name}: mean power {max(over):.2f}x the device's enforced power limit: "
                "implausible, the energy counter or its window is wrong"
            )
        cuda_name = (record.device_name or None) if record.device == "cuda" else None  # as NVML
        fill_peak(record, pass_name, self.device_name or cuda_name)

    def _names(self, bits: int) -> list[str]:
        if self.source is None:
            return []
        try:
            return self.source.event_names(bits)
        except Exception:
            return [f"0x{bits:x}"]
