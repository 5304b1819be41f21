"""lcab's GPU telemetry through NVIDIA's real ``pynvml`` over the emulated ``libnvidia-ml.so.1``.

The emulated device 0 (``tests/helpers/emulated_nvml.c``) runs its SM clock at 1980 MHz for
40 ms after ``nvmlInit``, then 1755 / 1830 MHz alternating every 20 ms, at 450 W then 690 W
under an enforced limit of 700 W, with an energy counter that integrates that power in 100 ms
steps (as the driver's advances) and the SwPowerCap reason after 40 ms; the driver buffer
samples clock, memory clock and power every 10 ms and a power-violation counter runs from
40 ms; device 1 refuses the energy counter and keeps no buffer. Each test runs a subprocess
(the loader reads ``LD_LIBRARY_PATH`` at start) that samples with lcab's own `Sampler` and
prints JSON.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import emulated_nvml

emulated_nvml_dir = emulated_nvml.emulated_nvml_dir

SAMPLE = """
import json, threading, time
from lcab.bench.telemetry import Sampler
from lcab.bench.telemetry_sources import NvmlSource
source = NvmlSource(DEVICE)
readings = []
for hold_s in (0.12, 0.12):
    alive = threading.active_count()
    with Sampler(source, interval_ms=5) as s:
        beside = threading.active_count() - alive
        time.sleep(hold_s)
    r = s.reading
    readings.append({
        "device": r.device_name, "window_s": r.window_s, "energy_j": r.energy_j,
        "window_energy_j": r.window_energy_j(), "clocks": r.clocks(),
        "mem": r.clocks("mem_clock_mhz"), "power_w": r.power_w(), "limit": r.power_limit_w,
        "temperature_c": r.temperature_c(), "events": r.events, "notes": r.notes,
        "n": len(r.samples), "inside": len(r.inside()), "beside": beside,
    })
print(json.dumps(readings))
"""


def _sample(
    directory: Path,
    device: int,
    hang_after: int | None = None,
    init: str | None = None,
    interval: str = "5",
) -> list[dict[str, Any]]:
    """Two windows of ``Sampler(source, interval_ms=interval)`` ("None": at the ends only)."""
    done = emulated_nvml.run_with_nvml(
        directory,
        SAMPLE.replace("DEVICE", str(device)).replace("interval_ms=5", f"interval_ms={interval}"),
        hang_after=hang_after,
        init="driver_not_loaded" if init else None,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(
    env: dict[str, str], tmp_path: Path, *overrides: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """A real CPU cell with ``bench.telemetry=nvml`` over the emulated library; its record."""
    done = subprocess.run(
        [sys.executable, "-m", "lcab.main", *overrides, *NVML_CELL, f"hydra.run.dir={tmp_path}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])


NVML_CELL = ("bench.telemetry=nvml", "bench.mask_samples=1", "bench.check_numerics=false")


def test_clocks_power_energy_and_reasons_of_a_gpu(emulated_nvml_dir: Path) -> None:
    first, second = _sample(emulated_nvml_dir, 0)
    assert first["device"] == "NVIDIA H100 80GB HBM3"
    low, _, high = first["clocks"]
    assert (low, high) == (1755.0, 1980.0)  # the emulated pattern's extremes, 120 ms at 5 ms
    assert first["mem"][1] == 2619.0
    # 120 ms past the 40 ms boost, at 690 W: the counter moved by whole 100 ms steps (69 J), too
    # coarse for the window's energy, so its power is the samples' mean
    assert second["energy_j"] % 69.0 == 0 and second["window_energy_j"] is None
    assert second["power_w"] == pytest.approx(690.0, rel=0.01)
    assert second["limit"] == 700.0
    assert second["clocks"][2] < 1980.0  # past the 40 ms boost: only 1755 and 1830
    assert "SwPowerCap" in second["events"]
    assert 52.0 <= second["temperature_c"] <= 70.0
    assert not second["notes"]


def test_a_gpu_without_an_energy_counter_says_so_and_keeps_its_power(
    emulated_nvml_dir: Path,
) -> None:
    reading = _sample(emulated_nvml_dir, 1)[1]
    assert reading["device"] == "NVIDIA H200"
    assert reading["energy_j"] is None
    assert any("energy counter" in n and "Not Supported" in n for n in reading["notes"])
    assert reading["power_w"] == pytest.approx(690.0, rel=0.01)  # the samples' mean


def test_a_node_without_a_driver_gets_a_note_not_an_error(emulated_nvml_dir: Path) -> None:
    reading = _sample(emulated_nvml_dir, 0, init="driver_not_loaded")[0]
    assert reading["clocks"] is None and reading["energy_j"] is None
    assert reading["notes"] == ["NVML: Driver Not Loaded"]


def test_a_hung_driver_call_is_abandoned_and_never_called_again(emulated_nvml_dir: Path) -> None:
    """Power hangs after 3 reads: the window ends within the sampler's wait, the next one
    says why it has nothing, and the process still ends."""
    start = time.monotonic()
    first, second = _sample(emulated_nvml_dir, 0, hang_after=3)
    assert time.monotonic() - start < 20
    assert any("did not return within" in n for n in first["notes"])
    assert any("earlier in this process" in n for n in second["notes"])
    assert second["n"] == 0


def test_read_at_the_ends_nothing_runs_beside_the_window_and_the_buffer_gives_the_clocks(
    emulated_nvml_dir: Path,
) -> None:
    """The default: no thread alive in the window; the driver's 10 ms samples in between."""
    first, second = _sample(emulated_nvml_dir, 0, interval="None")
    for reading in (first, second):
        assert reading["beside"] == 0
        # two end samples plus the buffer's: about 12 per 120 ms (no thread read them)
        assert reading["n"] >= 2 + 10
        assert not reading["notes"]
    assert first["clocks"][0] == 1755.0 and first["clocks"][2] == 1980.0  # boost, then capped
    assert second["clocks"][2] < 1980.0
    assert second["mem"][1] == 2619.0
    assert second["inside"] >= 10  # the buffer's samples inside the window: the clocks' source
    assert second["power_w"] == pytest.approx(690.0, rel=0.01)
    # the end reading's reason bit and the violation counter that advanced in the window
    assert "SwPowerCap" in second["events"] and "PowerViolation" in second["events"]


def test_without_a_driver_buffer_the_ends_alone_are_read_and_it_is_said(
    emulated_nvml_dir: Path,
) -> None:
    reading = _sample(emulated_nvml_dir, 1, interval="None")[1]
    assert reading["n"] == 2
    assert any(n.startswith("NVML sample buffer: Not Supported") for n in reading["notes"])
    assert reading["power_w"] == pytest.approx(690.0, rel=0.01)
    assert "PowerViolation" in reading["events"]  # device 1 still has the counters


def test_a_hung_end_read_is_abandoned_within_the_wait(emulated_nvml_dir: Path) -> None:
    """The second power read (the first window's closing one) hangs."""
    start = time.monotonic()
    first, second = _sample(emulated_nvml_dir, 0, hang_after=1, interval="None")
    assert time.monotonic() - start < 20
    assert any("read did not return within" in n for n in first["notes"])
    assert first["energy_j"] is None
    assert any("earlier in this process" in n for n in second["notes"])
    assert second["n"] == 0


ENERGY = """
import json, math, time
from lcab.bench.pass_telemetry import LengthTelemetry
from lcab.bench.telemetry import Sampler
from lcab.bench.telemetry_sources import NvmlSource
source = NvmlSource(0)
telemetry = LengthTelemetry(source, None, None, shared_counter=False)

def calls(n):
    for _ in range(n):
        time.sleep(0.02)  # a 20 ms 'call' at the device's 690 W

with Sampler(source):
    time.sleep(0.15)  # past the 40 ms boost and the counter's first step
shorts = []
for _ in range(6):  # the timed window of five 4 ms calls, as the energy used to be read
    with Sampler(source) as timed:
        time.sleep(0.02)
    shorts.append([timed.reading.energy_j, timed.reading.window_s])
window = telemetry.energy_window(timed, 20.0, calls, None)
figures = telemetry.after(timed, window)
with Sampler(source) as short:  # a window under the counter's 1 s
    time.sleep(0.3)
short.reading.calls = 1
empty = telemetry.after(timed, short)
print(json.dumps({
    "shorts": shorts, "window_s": window.reading.window_s, "calls": window.reading.calls,
    "energy_j": figures.energy_j, "power_w": figures.power_w,
    "recorded": [figures.energy_window_s, figures.energy_calls],
    "empty": empty.energy_j, "notes": telemetry.notes,
}))
"""


def test_a_pass_energy_comes_from_a_window_the_counter_resolves(emulated_nvml_dir: Path) -> None:
    """A 20 ms window reads 0 J or a whole 100 ms step of the counter (69 J at 690 W), never
    its 13.8 J; the energy window of 1.25 s of calls reads 690 W to within one step."""
    done = emulated_nvml.run_with_nvml(emulated_nvml_dir, ENERGY, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    shorts = [(e, w) for e, w in got["shorts"] if w < 0.05]  # a busy host may stretch a sleep
    assert shorts
    for energy_j, window_s in shorts:
        assert energy_j % 69.0 == 0  # nothing, or whole steps: per call 0 or >= 1.4x the truth
        assert abs(energy_j - 690 * window_s) > 0.5 * 690 * window_s
    assert got["calls"] == math.ceil(1.25 / 0.02)  # 10 steps of 100 ms and a quarter, at 20 ms
    assert got["window_s"] >= 1.25 and got["recorded"] == [got["window_s"], got["calls"]]
    # one step (69 J) at most off in a window of >= 12.5 steps: within 8 %
    assert got["power_w"] == pytest.approx(690.0, rel=0.08)
    truth = 690.0 * got["window_s"] / got["calls"]  # 690 W over each call's share of the window
    assert got["energy_j"] == pytest.approx(truth, rel=0.08)
    assert got["empty"] is None
    assert any(n.startswith("energy left empty: a window under the 1 s") for n in got["notes"])


def _share_of_h100_fp32(result: dict[str, Any]) -> float:
    """The expected peak (TFLOP/s) of the emulated H100's fp32 pass, by hand: 132 SMs x 256
    FLOP per clock at the median clock sampled inside the window, else the rated 66.9."""
    if result["clock_samples"]:
        return 132 * 256 * result["clock_mhz_median"] * 1e6 / 1e12
    return 66.9


def test_a_cell_records_gpu_telemetry_and_the_share_of_the_peak(
    emulated_nvml_dir: Path, tmp_path: Path
) -> None:
    """A real CPU cell with ``bench.telemetry=nvml``: the record carries device 0's figures."""
    env = emulated_nvml.nvml_env(emulated_nvml_dir)
    done, record = _cell(
        env, tmp_path, "kernel=ranges", "mask=causal", "seqlen.values=[1024]", "bench.reps=20"
    )
    assert record["telemetry_source"] == "nvml"
    assert record["telemetry_device"] == "NVIDIA H100 80GB HBM3"
    assert record["telemetry_power_limit_w"] == 700.0  # the emulated driver's default limit
    for name in ("fwd", "bwd"):
        result = record[name]
        assert result["status"] == "ok"
        assert 1755.0 <= result["clock_mhz_min"] <= result["clock_mhz_median"] <= 1980.0
        inside = result["clock_samples"] > 0
        assert result["clock_source"] == ("inside the window" if inside else "the window's ends")
        # the energy window: >= 1.25 s of calls at 690 W, one 69 J step at most off
        assert result["energy_window_s"] >= 1.25 and result["energy_calls"] >= 1
        assert result["power_w"] == pytest.approx(690.0, rel=0.08)
        per_call = 690.0 * result["energy_window_s"] / result["energy_calls"]
        assert result["energy_j"] == pytest.approx(per_call, rel=0.08)
        assert result["energy_j_per_token"] == pytest.approx(result["energy_j"] / 1024)
        assert result["gflops_per_j"] == pytest.approx(result["flops"] / result["energy_j"] / 1e9)
        peak = _share_of_h100_fp32(result)
        assert result["peak_tflops"] == pytest.approx(peak, rel=1e-3)
        assert result["peak_share"] == pytest.approx(result["tflops"] / peak, rel=1e-3)
        assert result["peak_implausible"] is False
        assert {"SwPowerCap", "PowerViolation"} <= set(result["clock_events"])
    assert not any("power limit" in r for r in record["reasons"])
    assert "clock power" in done.stdout and " MHz " in done.stdout  # the table's telemetry columns


def test_no_sample_inside_the_window_leaves_the_peak_rated_and_power_over_its_limit_is_flagged(
    emulated_nvml_dir: Path, tmp_path: Path
) -> None:
    """A driver that samples once a minute puts no sample inside any window: the clock is the
    end reads' and the peak stays the rated 66.9 TFLOP/s; a 500 W limit under 690 W is flagged."""
    env = emulated_nvml.nvml_env(emulated_nvml_dir, sample_period_ms=60_000, power_limit_w=500)
    _, record = _cell(
        env, tmp_path, "kernel=ranges", "mask=causal", "seqlen.values=[512]", "bench.passes=[fwd]"
    )
    fwd = record["fwd"]
    assert fwd["clock_samples"] == 0 and fwd["clock_source"] == "the window's ends"
    assert fwd["peak_tflops"] == pytest.approx(66.9)
    assert fwd["peak_share"] == pytest.approx(fwd["tflops"] / 66.9, rel=1e-3)
    assert "no clock sample fell inside the timed window" in record["peak_basis"]
    assert fwd["power_w"] == pytest.approx(690.0, rel=0.08)
    said = [r for r in record["reasons"] if "enforced power limit" in r]
    assert len(said) == 1 and said[0].startswith("fwd: mean power ")
    over = float(said[0].removeprefix("fwd: mean power ").split("x")[0])
    assert over == pytest.approx(690 / 500, rel=0.08)  # one counter step at most off
    assert record["telemetry_power_limit_w"] == 500.0  # the limit the driver was set to


def test_a_pass_above_the_peak_at_its_clock_is_flagged(
    emulated_nvml_dir: Path, tmp_path: Path
) -> None:
    """Plant a clock of 1 MHz on an 'A100': its fp32 peak there is 108 SMs x 128 FLOP per clock
    = 13.8 GFLOP/s, which SDPA on a full mask passes on any CPU (~200 GFLOP/s on 2 idle cores
    here; it can fall near it on a host loaded several times over)."""
    env = emulated_nvml.nvml_env(emulated_nvml_dir, sm_mhz=1, name0="NVIDIA A100-SXM4-80GB")
    done, record = _cell(
        env, tmp_path, "kernel=sdpa", "mask=full", "seqlen.values=[2048]", "bench.passes=[fwd]"
    )
    fwd = record["fwd"]
    assert fwd["clock_mhz_median"] == 1.0 and fwd["clock_samples"] > 0
    peak = 108 * 128 * 1e6 / 1e12
    assert fwd["peak_tflops"] == pytest.approx(peak, rel=1e-3)
    assert fwd["peak_share"] == pytest.approx(fwd["tflops"] / peak, rel=1e-3)
    assert fwd["peak_share"] > 1 and fwd["peak_implausible"] is True
    assert any("implausible" in r and r.startswith("fwd:") for r in record["reasons"])
    assert "implausible" in done.stdout  # the console's note
