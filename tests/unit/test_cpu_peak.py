"""A CPU pass's share of its host's ceiling (`lcab.bench.cpu_peak`).

The measured rate is checked against a matmul timed here by PyTorch's own benchmark timer (an
independent protocol on the same CPU-time clock); the nominal rate against ``/proc/cpuinfo``
trees written here; the share and the flag against hand-computed values on planted ceilings;
and a real fp16 CPU cell, whose SDPA runs far above an fp16 matmul, carries them end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils import benchmark

from lcab.bench import cpu_peak, host_load
from lcab.bench.pass_telemetry import fill_peak
from lcab.records.schema import PassResult, RunRecord

CPUINFO = "processor\t: 0\ncpu MHz\t\t: {mhz}\nflags\t\t: {flags}\n"


def test_the_measured_rate_agrees_with_a_matmul_timed_by_torch_benchmark() -> None:
    ceiling = cpu_peak.cpu_ceiling("float32")
    assert ceiling is not None and ceiling.threads == torch.get_num_threads()
    side = ceiling.side
    a, b = torch.randn(side, side), torch.randn(side, side)
    timer = benchmark.Timer(  # the Timer runs on one thread unless told
        "torch.matmul(a, b)",
        globals={"a": a, "b": b},
        num_threads=ceiling.threads,
        timer=time.process_time,
    )
    measured = timer.blocked_autorange(min_run_time=0.3)
    independent = 2.0 * side**3 / (min(measured.times) / ceiling.threads) / 1e12
    # two best readings on a host other tests share: within 2x each way, which a unit or
    # FLOP-count slip (1e3x, 2x side) would not be
    assert independent / 2 <= ceiling.measured_tflops <= independent * 2


def test_a_ceiling_is_measured_once_per_dtype_and_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[torch.dtype, int]] = []

    def measure(dtype: torch.dtype, threads: int) -> tuple[float, int]:
        calls.append((dtype, threads))
        return 1.0, 64

    monkeypatch.setattr(cpu_peak, "_MEASURED", {})
    monkeypatch.setattr(cpu_peak, "_measure", measure)
    first = cpu_peak.cpu_ceiling("float64")
    assert cpu_peak.cpu_ceiling("float64") is first
    assert calls == [(torch.float64, torch.get_num_threads())]
    assert cpu_peak.cpu_ceiling("float8_nosuch") is None  # no such torch dtype: no peak


def test_half_precision_takes_the_faster_of_its_matmul_and_float32s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU kernel computes half precision in float32 unless its backend is faster natively."""
    rates = {torch.float16: 0.001, torch.bfloat16: 0.4, torch.float32: 0.08}
    monkeypatch.setattr(cpu_peak, "_MEASURED", {})
    monkeypatch.setattr(cpu_peak, "_measure", lambda dtype, threads: (rates[dtype], 256))
    monkeypatch.setattr(cpu_peak, "nominal_tflops", lambda threads: None)
    fp16, bf16 = cpu_peak.cpu_ceiling("float16"), cpu_peak.cpu_ceiling("bfloat16")
    assert fp16 is not None and (fp16.tflops, fp16.dtype) == (0.08, "float32")
    assert bf16 is not None and (bf16.tflops, bf16.dtype) == (0.4, "bfloat16")  # AMX, say


@pytest.mark.parametrize(("flags", "per_cycle"), [("sse avx avx2 fma", 32), ("sse avx", 16)])
def test_the_nominal_rate_is_the_threads_at_their_clock(
    tmp_path: Path, flags: str, per_cycle: int
) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(CPUINFO.format(mhz="2445.414", flags=flags))
    expected = 2 * 2445.414e6 * per_cycle / 1e12  # 0.156 TFLOP/s on two AVX2 cores
    assert cpu_peak.nominal_tflops(2, tmp_path) == pytest.approx(expected)
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nflags\t\t: fma\n")  # no clock
    assert cpu_peak.nominal_tflops(2, tmp_path) is None


def _cpu_record(tflops: float) -> RunRecord:
    record = RunRecord(dtype="float32", passes=["fwd"], device="cpu")
    record.fwd = PassResult(status="ok", tflops=tflops)
    return record


def _plant(monkeypatch: pytest.MonkeyPatch, ceiling: cpu_peak.CpuCeiling) -> None:
    monkeypatch.setattr(cpu_peak, "_MEASURED", {("float32", torch.get_num_threads()): ceiling})


@pytest.mark.parametrize(("rate", "flagged"), [(0.05, False), (0.149, False), (0.16, True)])
def test_the_share_is_the_rate_over_the_ceiling_and_above_1_5_is_flagged(
    monkeypatch: pytest.MonkeyPatch, rate: float, flagged: bool
) -> None:
    threads = torch.get_num_threads()
    _plant(monkeypatch, cpu_peak.CpuCeiling(0.1, "float32", threads, 512))  # 100 GFLOP/s
    record = _cpu_record(rate)
    fill_peak(record, "fwd", None)
    assert record.fwd.peak_tflops == 0.1
    assert record.fwd.peak_share == pytest.approx(rate / 0.1)
    assert record.fwd.peak_implausible is flagged
    assert (record.peak_basis or "").startswith(f"measured: best float32 matmul on {threads} ")
    assert any("implausible" in r for r in record.reasons) is flagged
    if flagged:
        assert record.reasons[0].startswith("fwd: 160.0 GFLOP/s is 1.6x this host's ceiling")


def test_a_probe_slowed_by_load_never_flags_a_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The issue's record: a probe that read 3.0 GFLOP/s on a loaded 2-core host, and a pass
    of 21.8 flagged at 7.3x it. The host's nominal rate (2 cores at 2445 MHz, 32 FLOP a cycle:
    156.5 GFLOP/s) is the ceiling instead."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(CPUINFO.format(mhz="2445.414", flags="avx2 fma"))
    threads = torch.get_num_threads()
    nominal = cpu_peak.nominal_tflops(threads, tmp_path)
    _plant(monkeypatch, cpu_peak.CpuCeiling(0.003, "float32", threads, 256, nominal))
    record = _cpu_record(0.0218)
    fill_peak(record, "fwd", None)
    expected = threads * 2445.414e6 * 32 / 1e12
    assert record.fwd.peak_tflops == pytest.approx(expected)
    assert record.fwd.peak_share == pytest.approx(0.0218 / expected)
    assert record.fwd.peak_implausible is False and not record.reasons


def test_a_busy_host_share_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(monkeypatch, cpu_peak.CpuCeiling(0.1, "float32", torch.get_num_threads(), 512))
    cores = host_load.usable_cores()
    busy = host_load.LoadSnapshot(cores * 4.0, None, None)
    monkeypatch.setattr(host_load, "snapshot", lambda: busy)
    record = _cpu_record(0.05)
    fill_peak(record, "fwd", None)
    assert (record.peak_basis or "").endswith(
        f"; host busy (load {cores * 4.0:.1f} on {cores} cores)"
    )
    monkeypatch.setattr(host_load, "snapshot", lambda: host_load.LoadSnapshot(0.0, None, None))
    quiet = _cpu_record(0.05)
    fill_peak(quiet, "fwd", None)
    assert "busy" not in (quiet.peak_basis or "")


def test_a_pass_that_did_not_run_or_a_cpu_read_through_nvml_gets_no_cpu_peak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cpu_peak, "_measure", lambda *_: pytest.fail("measured needlessly"))
    failed = _cpu_record(0.1)
    failed.fwd.status = "oom"
    fill_peak(failed, "fwd", None)
    assert failed.fwd.peak_share is None
    # a CPU cell whose telemetry named a GPU (bench.telemetry=nvml) takes that GPU's peak
    named = _cpu_record(0.1)
    fill_peak(named, "fwd", "NVIDIA H100 80GB HBM3")
    assert named.fwd.peak_tflops is not None and named.fwd.peak_tflops > 10
    assert (named.peak_basis or "").startswith("rated: H100")


def test_an_fp16_cpu_cell_is_not_flagged(tmp_path: Path) -> None:
    """The issue's cell: fp16 SDPA runs ~13x an fp16 ``torch.matmul`` here, and an fp16 ceiling
    flagged it at share 13.2. Its ceiling is float32's, never below the host's nominal rate."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lcab.main",
            "kernel=sdpa",
            "mask=full",
            "seqlen.values=[1024]",
            "problem.dtype=float16",
            "bench.mask_samples=1",
            "bench.check_numerics=false",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert record["dtype"] == "float16" and record["peak_basis"].startswith("measured:")
    nominal = cpu_peak.nominal_tflops(torch.get_num_threads())  # the cell's default threads
    for name in ("fwd", "bwd"):
        result = record[name]
        assert result["status"] == "ok"
        if nominal is not None:
            assert result["peak_tflops"] >= nominal * 0.5  # a clock that moved since the cell
        assert 0 < result["peak_share"] < cpu_peak.IMPLAUSIBLE_CPU_SHARE
        assert result["peak_implausible"] is False
    assert not any("implausible" in r for r in record["reasons"])
    assert "clock power" in done.stdout and " MHz " in done.stdout  # the table's telemetry columns
