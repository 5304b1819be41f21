"""The emulated ``libnvidia-ml.so.1`` (`tests.helpers.emulated_nvml`) through the real pynvml.

Each test runs a subprocess (glibc reads ``LD_LIBRARY_PATH`` only at process start) that
imports NVIDIA's ``pynvml`` unchanged, calls it, and prints JSON. The expectations are the
brief's figures written out by hand here, not read back from the C file: SM clock 1980 MHz
for 40 ms after ``nvmlInit`` and then 1755/1830 MHz in 20 ms turns, power 450 W then 690 W,
energy the integral of that power from 123456789 mJ (in 100 ms steps), 52 °C plus one per
100 ms up to 70 °C.

Timing is checked with bounds, not guesses: around every call the subprocess notes
``time.monotonic_ns()`` (the library's own ``CLOCK_MONOTONIC``) before and after, so the
library's "time since nvmlInit" of that call lies in ``[lo, hi]`` = ``[call start - init end,
call end - init start]``, and a figure is asserted only where ``[lo, hi]`` pins it down.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import emulated_nvml

emulated_nvml_dir = emulated_nvml.emulated_nvml_dir

H100_UUID = "GPU-00000000-1111-2222-3333-444444444444"
H200_UUID = "GPU-00000000-1111-2222-3333-555555555555"

PRELUDE = """
import json, threading, time
import pynvml

_init = []

def init():
    a = time.monotonic_ns()
    pynvml.nvmlInit()
    _init[:] = [a, time.monotonic_ns()]

def timed(fn, *args):
    a = time.monotonic_ns()
    value = fn(*args)
    b = time.monotonic_ns()
    return [(a - _init[1]) / 1e6, (b - _init[0]) / 1e6, value]  # lo ms, hi ms, value
"""


def _run(directory: Path, body: str, *, timeout: float = 20.0, **settings: Any) -> Any:
    """Run ``PRELUDE + body`` with the emulated NVML; the JSON of its last stdout line."""
    code = PRELUDE + textwrap.dedent(body)
    done = emulated_nvml.run_with_nvml(directory, code, timeout=timeout, **settings)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_library_compiles_warning_free(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler 'cc' on PATH")
    strict = ("-Wall", "-Wextra", "-Werror", *emulated_nvml.COMPILE)
    done = subprocess.run(
        ["cc", *strict, "-o", str(tmp_path / "lib.so"), str(emulated_nvml.SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_build_is_cached_by_source_hash(emulated_nvml_dir: Path) -> None:
    library = emulated_nvml_dir / "libnvidia-ml.so.1"
    before = library.stat().st_mtime_ns
    assert emulated_nvml.build_emulated_nvml(emulated_nvml_dir) == emulated_nvml_dir
    assert library.stat().st_mtime_ns == before


def test_nvml_env_prefixes_the_library_path_and_drops_stale_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere")
    monkeypatch.setenv("LCAB_EMULATED_NVML_INIT", "driver_not_loaded")
    env = emulated_nvml.nvml_env(Path("/x/y"), sm_mhz=1410, hang_after=0)
    assert env["LD_LIBRARY_PATH"] == "/x/y:/opt/elsewhere"
    assert "LCAB_EMULATED_NVML_INIT" not in env
    assert env["LCAB_EMULATED_NVML_SM_MHZ"] == "1410"
    assert env["LCAB_EMULATED_NVML_HANG_AFTER"] == "0"


def test_identity_of_the_two_devices(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        f"""
        init()
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
        try:
            pynvml.nvmlDeviceGetHandleByUUID("GPU-ffffffff-0000-0000-0000-000000000000")
            unknown = "found"
        except pynvml.NVMLError_NotFound:
            unknown = "NotFound"
        print(json.dumps({{
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "names": [pynvml.nvmlDeviceGetName(h) for h in handles],
            "uuids": [pynvml.nvmlDeviceGetUUID(h) for h in handles],
            "by_uuid": pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByUUID("{H200_UUID}")),
            "unknown": unknown,
            "max_sm": [pynvml.nvmlDeviceGetMaxClockInfo(h, sm) for h in handles],
            "max_mem": [pynvml.nvmlDeviceGetMaxClockInfo(h, mem) for h in handles],
        }}))
        pynvml.nvmlShutdown()
        """,
    )
    assert got["names"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert got["uuids"] == [H100_UUID, H200_UUID]
    assert got["by_uuid"] == "NVIDIA H200"
    assert got["unknown"] == "NotFound"
    assert got["max_sm"] == [1980, 1980]
    assert got["max_mem"] == [2619, 2619]
    major, minor, patch = got["driver"].split(".")
    assert major.isdigit() and minor.isdigit() and patch.isdigit()


def test_sm_clock_boosts_then_alternates_and_memory_clock_holds(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        init()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        samples, mem = [], set()
        while time.monotonic_ns() - _init[1] < 220e6:
            samples.append(timed(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM))
            mem.add(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
            time.sleep(0.005)
        print(json.dumps({"samples": samples, "mem": sorted(mem)}))
        """,
    )
    samples = got["samples"]
    values = [value for _, _, value in samples]
    assert got["mem"] == [2619]
    assert set(values) <= {1980, 1755, 1830}
    assert len(set(values)) >= 2
    assert max(values) == 1980 and min(values) == 1755  # what a ~5 ms sampler sees
    assert values[0] == 1980  # the first call comes well inside the first 40 ms
    pinned = 0
    for lo, hi, value in samples:
        if emulated_nvml.expected_sm_mhz(lo) == emulated_nvml.expected_sm_mhz(hi) and hi - lo < 20:
            assert value == emulated_nvml.expected_sm_mhz(lo), (lo, hi, value)
            pinned += 1
    assert pinned >= len(samples) // 2


@pytest.mark.parametrize("period_ms", [0, 100])
def test_power_and_energy_integrate_to_the_same_figure(
    emulated_nvml_dir: Path, period_ms: int
) -> None:
    """Energy is the integral of the power up to the counter's last step (``period_ms``, 100
    by default, as the real driver's counter advances about every 100 ms; 0: every read)."""
    got = _run(
        emulated_nvml_dir,
        """
        init()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        first_energy = timed(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        first_power = timed(pynvml.nvmlDeviceGetPowerUsage, h)
        time.sleep(0.12)
        e0 = timed(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        time.sleep(0.3)
        e1 = timed(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        p1 = timed(pynvml.nvmlDeviceGetPowerUsage, h)
        print(json.dumps({"first_energy": first_energy, "first_power": first_power,
                          "e0": e0, "e1": e1, "p1": p1}))
        """,
        energy_period_ms=None if period_ms == 100 else period_ms,  # 100: the default
    )
    base = 123456789

    def energy(t: float) -> float:
        # mJ = W x ms: 450 W over [0, 40) ms, 690 W after, up to the last step; whole mJ
        if period_ms:
            t -= t % period_ms
        return base + 450 * min(t, 40) + 690 * max(t - 40, 0)

    for lo, hi, value in (got["first_energy"], got["e0"], got["e1"]):
        assert energy(lo) - 1 <= value <= energy(hi), (lo, hi, value)

    _, hi, first_power = got["first_power"]
    if hi < 40:
        assert first_power == 450_000  # mW
    assert got["p1"][0] >= 40 and got["p1"][2] == 690_000

    (lo0, hi0, e0), (lo1, hi1, e1) = got["e0"], got["e1"]
    assert lo0 >= 100
    if period_ms:  # both reads past the first step: whole steps of 690 W x 100 ms between them
        assert (e1 - e0) % 69_000 == 0 and 2 <= (e1 - e0) // 69_000 <= (hi1 - lo0) // 100 + 1
        return
    # every read: energy = 690 W x the window, to 1 mJ of truncation
    window_min, window_max = lo1 - hi0, hi1 - lo0  # ms, bounds on the library's own window
    assert 690 * window_min - 1 <= e1 - e0 <= 690 * window_max + 1
    mean_power_w = (e1 - e0) / ((window_min + window_max) / 2)
    assert mean_power_w == pytest.approx(690, rel=0.02)


def test_enforced_power_limit_and_its_setting(emulated_nvml_dir: Path) -> None:
    body = """
        init()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1)]
        print(json.dumps([pynvml.nvmlDeviceGetEnforcedPowerLimit(h) for h in handles]))
        """
    assert _run(emulated_nvml_dir, body) == [700_000, 700_000]  # mW: an H100 SXM5's 700 W
    assert _run(emulated_nvml_dir, body, power_limit_w=500) == [500_000, 500_000]


def test_energy_not_supported_on_device_1(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        init()
        h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(h1)
            outcome = "returned"
        except pynvml.NVMLError_NotSupported as error:
            outcome = [type(error).__name__, error.value, str(error)]
        print(json.dumps({"outcome": outcome, "power": pynvml.nvmlDeviceGetPowerUsage(h1)}))
        """,
    )
    assert got["outcome"] == ["NVMLError_NotSupported", 3, "Not Supported"]
    assert got["power"] in (450_000, 690_000)


def test_temperature_rises_a_degree_per_100_ms_to_70(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        import ctypes
        init()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        gpu = pynvml.NVML_TEMPERATURE_GPU
        first = timed(pynvml.nvmlDeviceGetTemperature, h, gpu)
        time.sleep(0.35)
        middle = timed(pynvml.nvmlDeviceGetTemperature, h, gpu)
        versioned = timed(pynvml.nvmlDeviceGetTemperatureV, h, gpu)
        time.sleep(1.6)
        late = timed(pynvml.nvmlDeviceGetTemperature, h, gpu)
        wrong = pynvml.c_nvmlTemperature_v1_t()
        wrong.version = 0x2000000 | ctypes.sizeof(wrong)
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")
        print(json.dumps({"first": first, "middle": middle, "versioned": versioned,
                          "late": late, "wrong_version": fn(h, ctypes.byref(wrong))}))
        """,
    )

    def celsius(t_ms: float) -> int:
        return min(52 + int(t_ms // 100), 70)

    for key in ("first", "middle", "versioned"):
        lo, hi, value = got[key]
        assert celsius(lo) <= value <= celsius(hi), (key, lo, hi, value)
    assert got["first"][2] == 52 or got["first"][1] >= 100
    assert got["middle"][2] >= 55
    assert got["late"][2] == 70  # capped: 52 + 18 degrees takes 1.8 s
    assert got["wrong_version"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_clock_event_reasons_turn_to_sw_power_cap(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        init()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        first = timed(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        time.sleep(0.06)
        later = timed(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        older = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        print(json.dumps({"first": first, "later": later, "older": older,
                          "bit": pynvml.nvmlClocksEventReasonSwPowerCap}))
        """,
    )
    assert got["bit"] == 0x4
    _, hi, first = got["first"]
    if hi < 40:
        assert first == 0
    assert got["later"][0] >= 40 and got["later"][2] == 0x4
    assert got["older"] == 0x4


def test_planted_sm_clock_and_name(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        init()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
        clocks = set()
        for _ in range(12):
            clocks |= {pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) for h in handles}
            time.sleep(0.01)
        print(json.dumps({
            "clocks": sorted(clocks),
            "share": pynvml.nvmlDeviceGetClockInfo(handles[0], pynvml.NVML_CLOCK_SM)
            / pynvml.nvmlDeviceGetMaxClockInfo(handles[0], pynvml.NVML_CLOCK_SM),
            "names": [pynvml.nvmlDeviceGetName(h) for h in handles],
        }))
        """,
        sm_mhz=1485,
        name0="NVIDIA A100-SXM4-80GB",
    )
    assert got["clocks"] == [1485]
    assert got["share"] == pytest.approx(0.75)  # 1485 / 1980
    assert got["names"] == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]


def test_driver_not_loaded_fails_init(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        try:
            pynvml.nvmlInit()
            outcome = "initialized"
        except pynvml.NVMLError_DriverNotLoaded as error:
            outcome = [type(error).__name__, error.value, str(error)]
        print(json.dumps(outcome))
        """,
        init="driver_not_loaded",
    )
    assert got == ["NVMLError_DriverNotLoaded", 9, "Driver Not Loaded"]


@pytest.mark.parametrize(
    ("name", "value"), [("SM_MHZ", "fast"), ("SAMPLE_PERIOD_MS", "0"), ("ENERGY_PERIOD_MS", "-5")]
)
def test_malformed_setting_fails_init_loudly(
    emulated_nvml_dir: Path, name: str, value: str
) -> None:
    got = _run(
        emulated_nvml_dir,
        f"""
        import os
        os.environ["LCAB_EMULATED_NVML_{name}"] = "{value}"
        try:
            pynvml.nvmlInit()
            outcome = "initialized"
        except pynvml.NVMLError_InvalidArgument:
            outcome = "InvalidArgument"
        print(json.dumps(outcome))
        """,
    )
    assert got == "InvalidArgument"


def test_init_is_counted_and_queries_need_it(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        init()
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlShutdown()
        still = pynvml.nvmlDeviceGetPowerUsage(h) > 0
        pynvml.nvmlShutdown()
        try:
            pynvml.nvmlDeviceGetPowerUsage(h)
            after = "returned"
        except pynvml.NVMLError_Uninitialized:
            after = "Uninitialized"
        print(json.dumps([still, after]))
        """,
    )
    assert got == [True, "Uninitialized"]


def test_hung_power_call_blocks_only_its_thread(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        init()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        readings = []

        def sample():
            while True:
                readings.append(pynvml.nvmlDeviceGetPowerUsage(h))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        sampler.join(timeout=0.4)
        print(json.dumps({
            "alive": sampler.is_alive(),
            "readings": len(readings),
            "clock": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        }))
        """,
        hang_after=3,
    )
    assert got == {"alive": True, "readings": 3, "clock": 2619}
