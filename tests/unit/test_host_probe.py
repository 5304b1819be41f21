"""hardware=auto: the host probe's cache, and the CPU profile scaled by its figures."""

from __future__ import annotations

import json

import pytest

from lcab.plan import hardware as auto
from lcab.plan import host_speed as host_probe
from lcab.plan.hardware import load_profile
from lcab.plan.host_speed import HostFigures


@pytest.fixture
def probes(monkeypatch, tmp_path):
    """Point the cache at ``tmp_path``; `measure` returns fixed figures and counts its calls."""
    monkeypatch.setenv("LCAB_CACHE_DIR", str(tmp_path))
    calls: list[HostFigures] = []

    def fake() -> HostFigures:
        calls.append(HostFigures(10.0 + len(calls), 2.0, 0.5))
        return calls[-1]

    monkeypatch.setattr(host_probe, "measure", fake)
    monkeypatch.setattr(host_probe, "host_busy", lambda: False)
    return calls


def test_a_busy_hosts_figures_are_used_but_not_cached(probes, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(host_probe, "host_busy", lambda: True)
    assert host_probe.host_figures() == HostFigures(10.0, 2.0, 0.5)
    assert not (tmp_path / "host_probe.json").exists()
    assert host_probe.host_figures() == HostFigures(11.0, 2.0, 0.5)  # measured again
    assert host_probe.host_figures(fresh=True) == HostFigures(12.0, 2.0, 0.5)  # asked for: kept
    assert host_probe.host_figures() == HostFigures(12.0, 2.0, 0.5)


def test_the_probe_is_measured_once_per_host_then_read_from_the_cache(probes, tmp_path) -> None:
    first = host_probe.host_figures()
    again = host_probe.host_figures()
    assert len(probes) == 1 and again == first == HostFigures(10.0, 2.0, 0.5)
    stored = json.loads((tmp_path / "host_probe.json").read_text())
    assert list(stored) == [f"{host_probe.host_key()}|v{host_probe.PROBE_VERSION}"]
    assert host_probe.host_figures(fresh=True) == HostFigures(11.0, 2.0, 0.5)
    assert len(probes) == 2


def test_another_host_a_stale_entry_or_a_broken_cache_is_measured_again(
    probes, tmp_path, monkeypatch
) -> None:
    host_probe.host_figures()
    monkeypatch.setattr(host_probe, "host_key", lambda: "elsewhere|cpu|2|torch")
    assert host_probe.host_figures() == HostFigures(11.0, 2.0, 0.5)
    assert len(json.loads((tmp_path / "host_probe.json").read_text())) == 2  # both hosts kept
    stored = json.loads((tmp_path / "host_probe.json").read_text())
    for entry in stored.values():  # a week and a second ago: stale
        entry["measured_at"] -= host_probe.MAX_AGE_S + 1
    (tmp_path / "host_probe.json").write_text(json.dumps(stored))
    assert host_probe.host_figures() == HostFigures(12.0, 2.0, 0.5)
    (tmp_path / "host_probe.json").write_text("{not json")
    assert host_probe.host_figures() == HostFigures(13.0, 2.0, 0.5)
    assert len(probes) == 4


def test_the_real_probe_measures_positive_rates_quickly() -> None:
    import time

    start = time.perf_counter()
    figures = host_probe.measure()
    assert time.perf_counter() - start < 30  # a second or two when idle; slack for load
    assert figures.attention_gflops > 0 and figures.memory_gbps > 0 and figures.loopback_gbps > 0


def test_auto_scales_each_term_by_its_figure(monkeypatch) -> None:
    ref = auto.reference_figures()
    here = HostFigures(2 * ref.attention_gflops, 3 * ref.memory_gbps, 0.5 * ref.loopback_gbps)
    monkeypatch.setattr(auto, "host_figures", lambda fresh=False: here)
    monkeypatch.setattr(auto, "available_cores", lambda: 16)
    base, scaled = load_profile("cpu_gloo_local"), load_profile("auto")
    assert scaled.name == "cpu_gloo_local@auto" and scaled.device == "cpu"
    for name, rate in base.kernels.items():
        assert scaled.kernels[name].fwd_tflops == pytest.approx(2 * rate.fwd_tflops)
        assert scaled.kernels[name].bwd_tflops == pytest.approx(2 * rate.bwd_tflops)
        assert scaled.kernels[name].half_keys == rate.half_keys  # shapes stay as fitted
    assert scaled.memory_gbps == pytest.approx(3 * base.memory_gbps)
    assert scaled.intra.gbps == pytest.approx(0.5 * base.intra.gbps)
    assert scaled.inter.gbps == pytest.approx(0.5 * base.inter.gbps)
    assert scaled.intra.latency_us == base.intra.latency_us
    assert base.compute_slots_per_node == 2 and scaled.compute_slots_per_node == 16


def test_auto_gives_cuda_cells_the_gpu_profile(monkeypatch) -> None:
    def no_probe(fresh: bool = False) -> HostFigures:
        raise AssertionError("a CUDA cell needs no host probe")

    monkeypatch.setattr(auto, "host_figures", no_probe)
    assert auto.auto_profile("cuda") == load_profile("h100_nvlink_ib")
