"""A pass's telemetry over ranks and mask samples, and its share of the peak, by hand."""

from __future__ import annotations

import math

import pytest

from lcab.bench.pass_telemetry import (
    LengthTelemetry,
    PassTelemetry,
    fill_peak,
    fill_telemetry,
    over_ranks,
)
from lcab.bench.telemetry_sources import HostSource
from lcab.records.schema import PassResult, RunRecord

NAN = math.nan


def test_ranks_with_their_own_gpus_add_their_energy() -> None:
    # clock low/median/high, memory clock, power, energy per call, temperature, event bits,
    # clock samples inside the window, energy window (s), power over the enforced limit
    ranks = [
        [1755, 1830, 1980, 2619, 690, 0.50, 61, 4, 7, 1.26, 690 / 700],
        [1700, 1800, 1900, 2619, 650, 0.40, 66, 0, 5, 1.31, 650 / 700],
        [1755, 1755, 1755, 2619, 700, 0.45, 58, 8, 0, 1.28, 700 / 700],
    ]
    combined = over_ranks(ranks, shared_counter=False)
    assert combined.clock_mhz == (1700, 1800, 1980)
    assert combined.power_w == pytest.approx((690 + 650 + 700) / 3)
    assert combined.power_w_max == 700
    assert combined.energy_j == pytest.approx(0.50 + 0.40 + 0.45)
    assert combined.temperature_c == 66
    assert combined.event_bits == 4 | 8
    assert combined.clock_samples == 0  # one rank's clock is its idle ends: the fewest counts
    assert combined.energy_window_s == 1.31 and combined.power_over_limit == 1.0


def test_ranks_sharing_one_counter_count_it_once() -> None:
    ranks = [[NAN] * 5 + [2.0, NAN, 0] + [NAN] * 3, [NAN] * 5 + [2.1, NAN, 0] + [NAN] * 3]
    combined = over_ranks(ranks, shared_counter=True)
    assert combined.energy_j == 2.1
    assert combined.clock_mhz is None and combined.power_w is None


def test_a_rank_without_a_counter_leaves_the_job_energy_unknown() -> None:
    ranks = [[NAN] * 5 + [0.5, NAN, 0] + [NAN] * 3, [NAN] * 5 + [NAN, NAN, 0] + [NAN] * 3]
    assert over_ranks(ranks, shared_counter=False).energy_j is None


def test_samples_give_the_pass_its_fields() -> None:
    result = PassResult(status="ok", flops=4_000_000_000_000, tflops=500.0)
    samples = [
        PassTelemetry((1755, 1830, 1980), 2619, 680, 690, 8.0, 60, 4),
        PassTelemetry((1700, 1755, 1830), 2619, 700, 710, 10.0, 64, 0),
        PassTelemetry((1755, 1900, 1980), 2619, 690, 700, 9.0, 62, 0),
    ]
    fill_telemetry(result, samples, tokens=8192, event_names=lambda bits: [f"bits {bits}"])
    assert (result.clock_mhz_min, result.clock_mhz_median, result.clock_mhz_max) == (
        1700,
        1830,
        1980,
    )
    assert result.power_w == 690 and result.power_w_max == 710
    assert result.energy_j == 9.0  # median of the samples
    assert result.energy_j_per_token == pytest.approx(9.0 / 8192)
    assert result.gflops_per_j == pytest.approx(4e12 / 9.0 / 1e9)
    assert result.temperature_c == 64
    assert result.clock_events == ["bits 4"]


def _record(device_name: str, tflops: float, clock: float | None, inside: int = 3) -> RunRecord:
    record = RunRecord(dtype="bfloat16", passes=["fwd"], device="cuda", device_name=device_name)
    record.fwd = PassResult(status="ok", tflops=tflops, clock_mhz_median=clock)
    record.fwd.clock_samples = inside
    return record


def test_the_share_of_the_peak_scales_with_the_measured_clock() -> None:
    # H100 SXM5 bf16: 132 SMs x 4096 FLOP/clock x 1830 MHz = 989.4 TFLOP/s (hand product)
    record = _record("NVIDIA H100 80GB HBM3", 600.0, 1755.0)
    fill_peak(record, "fwd", record.device_name)
    at_clock = 132 * 4096 * 1755e6 / 1e12
    assert record.fwd.peak_tflops == pytest.approx(at_clock, rel=1e-3)
    assert record.fwd.peak_share == pytest.approx(600.0 / at_clock, rel=1e-3)
    assert record.fwd.peak_implausible is False
    assert not record.reasons


def test_a_rate_above_the_peak_is_flagged_with_a_reason() -> None:
    """Megatron-Bridge #2665's 1,937 TFLOP/s per H200, at the clock of the rated figure."""
    record = _record("NVIDIA H200", 1937.0, 1830.0)
    fill_peak(record, "fwd", record.device_name)
    assert record.fwd.peak_share == pytest.approx(1937.0 / (132 * 4096 * 1830e6 / 1e12), rel=1e-3)
    assert record.fwd.peak_implausible is True
    assert record.reasons and record.reasons[0].startswith("fwd: 1,937.0 TFLOP/s is 196%")


def test_with_no_clock_sample_inside_the_window_the_peak_is_the_rated_one() -> None:
    """The clock then is the two end reads', of an idle device: it scales nothing."""
    record = _record("NVIDIA H100 80GB HBM3", 600.0, 1200.0, inside=0)
    fill_peak(record, "fwd", record.device_name)
    assert record.fwd.peak_tflops == pytest.approx(132 * 4096 * 1830e6 / 1e12, rel=1e-3)
    assert record.fwd.peak_share == pytest.approx(600.0 / 989.4, rel=1e-3)
    assert "no clock sample fell inside the timed window" in (record.peak_basis or "")


def test_power_above_the_enforced_limit_is_flagged_beyond_the_counter_resolution() -> None:
    """The energy window's counter is off by at most one step in ten: 1.05x the limit may be a
    step too many, 1.3x cannot be."""
    for over, flagged in ((1.05, False), (1.3, True)):
        record = RunRecord(dtype="float32", passes=["fwd"], device="cpu", seqlen=1024)
        record.fwd = PassResult(status="ok", flops=10**9, tflops=1.0)
        telemetry = LengthTelemetry(HostSource(), None, None, shared_counter=True)
        sample = PassTelemetry(power_w=700 * over, power_w_max=700 * over, power_over_limit=over)
        telemetry.fill(record, "fwd", [sample])
        said = [r for r in record.reasons if "enforced power limit" in r]
        assert bool(said) is flagged, (over, record.reasons)


def test_an_unknown_gpu_or_a_clock_of_zero_costs_nothing() -> None:
    unknown = _record("Some Accelerator 9000", 100.0, 1500.0)
    fill_peak(unknown, "fwd", unknown.device_name)
    assert unknown.fwd.peak_share is None and not unknown.reasons
    zero = _record("NVIDIA H100 80GB HBM3", 500.0, 0.0)  # a bad reading: the rated peak
    fill_peak(zero, "fwd", zero.device_name)
    assert zero.fwd.peak_tflops == pytest.approx(989.4, rel=1e-3)


def test_ranks_that_shared_a_gpu_get_no_share_and_show_no_energy_rate() -> None:
    """Their times measure nothing: no share of the peak, no flag, no per-call energy shown."""
    record = _record("NVIDIA H100 80GB HBM3", 5000.0, 1830.0)  # a rate no H100 reaches
    record.shared_device = True
    fill_peak(record, "fwd", record.device_name)
    assert record.fwd.peak_share is None and record.fwd.peak_implausible is None
    assert not record.reasons
    record.fwd.energy_j, record.fwd.power_w = 2.0, 600.0
    shown = record.measured_flat()
    assert shown["fwd_energy_j"] is None and shown["fwd_power_w"] == 600.0
