"""The CPU host's telemetry: RAPL energy (with its counter wrapping), cpufreq clocks, and what a
host without them says; the sampler around a real busy loop on this host."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import pytest

from lcab.bench.telemetry import Sampler
from lcab.bench.telemetry_sources import HostSource


def _rapl_tree(root: Path, energy_uj: int, span_uj: int = 262143328850) -> Path:
    """A powercap tree as the kernel lays it out: a package zone and one of its sub-zones."""
    zone = root / "sys/class/powercap/intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{span_uj}\n")
    sub = root / "sys/class/powercap/intel-rapl:0:0"  # the cores: inside the package already
    sub.mkdir()
    (sub / "energy_uj").write_text("999999999\n")
    (sub / "max_energy_range_uj").write_text(f"{span_uj}\n")
    return zone / "energy_uj"


def test_rapl_energy_counts_the_package_zone_and_survives_a_wrap(tmp_path: Path) -> None:
    span = 1_000_000  # 1 J range, so a test can wrap it
    counter = _rapl_tree(tmp_path, 900_000, span)
    source = HostSource(tmp_path, cores={0})
    source.open()
    assert source.energy_note() is None
    start = source.energy_j()
    counter.write_text("950000\n")  # +0.05 J
    mid = source.energy_j()
    counter.write_text("20000\n")  # wrapped: +0.05 J to the top, +0.02 J after it
    end = source.energy_j()
    assert start is not None and mid is not None and end is not None
    assert mid - start == pytest.approx(0.05)
    assert end - start == pytest.approx(0.05 + 0.05 + 0.02)


def test_a_host_without_rapl_says_so_once_and_reads_cpuinfo_clock(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(
        "processor\t: 0\ncpu MHz\t\t: 2000.000\nprocessor\t: 1\ncpu MHz\t\t: 3000.000\n"
        "processor\t: 2\ncpu MHz\t\t: 2600.000\n"
    )
    source = HostSource(tmp_path, cores={0, 1, 2})
    source.open()
    assert source.energy_j() is None
    assert "no RAPL energy counter" in (source.energy_note() or "")
    assert source.sample(0.0).clock_mhz == 2600.0  # median of 2000, 3000, 2600


def test_cpufreq_clocks_of_this_process_cores_only(tmp_path: Path) -> None:
    for core, khz in ((0, 1_200_000), (1, 3_400_000), (2, 2_000_000), (3, 9_999_999)):
        folder = tmp_path / f"sys/devices/system/cpu/cpu{core}/cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_cur_freq").write_text(f"{khz}\n")
    source = HostSource(tmp_path, cores={0, 1, 2})  # core 3 belongs to someone else
    source.open()
    assert source.sample(0.0).clock_mhz == 2000.0


def test_sampler_reads_the_rapl_counter_a_writer_advances(tmp_path: Path) -> None:
    """Energy over the window follows the counter, read at its two ends on the calling thread."""
    counter = _rapl_tree(tmp_path, 5_000_000)
    stop = threading.Event()

    written: list[float] = []  # when each value landed: a busy host delays the writer

    def writer() -> None:  # 100 W: 100 uJ per microsecond, written every 2 ms
        t0 = time.perf_counter()
        while not stop.is_set():
            # whole values only, as the kernel's sysfs file gives: write aside, then rename
            staged = counter.with_name("energy_uj.next")
            staged.write_text(f"{5_000_000 + int((time.perf_counter() - t0) * 100e6)}\n")
            os.replace(staged, counter)
            written.append(time.perf_counter())
            time.sleep(0.002)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        source = HostSource(tmp_path, cores={0})
        threads = threading.active_count()
        with Sampler(source, interval_ms=5) as sampler:
            inside = threading.active_count()
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(5)
    reading = sampler.reading
    assert reading.window_s is not None and reading.window_s >= 0.2
    assert reading.energy_j is not None
    # each end reads the last value written, at most one gap between writes old: the largest
    # gap the writer really left (2 ms idle, far more when the suite loads every core) bounds it
    lag = max(b - a for a, b in itertools.pairwise(written)) + 0.001
    assert reading.energy_j == pytest.approx(100 * reading.window_s, abs=100 * lag)
    power = reading.power_w()
    assert power is not None and 100 * (1 - lag / reading.window_s) < power
    assert power < 100 * (1 + lag / reading.window_s)
    # a host is read in place at the window's two ends: no thread beside the timed calls
    assert inside == threads and not sampler.threaded
    assert (
        len(reading.samples) == 2 and reading.samples[0].t_s < 0.01 <= 0.2 <= reading.samples[1].t_s
    )


def test_sampler_on_this_host_never_raises(tmp_path: Path) -> None:
    """Whatever this machine exposes, a reading comes back and says what is missing."""
    with Sampler(HostSource(), interval_ms=5) as sampler:
        sum(i * i for i in range(200_000))
    reading = sampler.reading
    assert reading.source == "host"
    assert reading.energy_j is not None or any("RAPL" in n for n in reading.notes)
