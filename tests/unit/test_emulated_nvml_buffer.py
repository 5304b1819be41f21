"""The emulated NVML's driver sample buffer and violation counters, through the real pynvml.

``nvmlDeviceGetSamples`` and ``nvmlDeviceGetViolationStatus`` are what lcab reads at a window's
two ends instead of polling the device from a thread (`lcab.bench.telemetry`). The expectations
are the emulation's brief written out by hand: device 0 samples its SM clock (1980 MHz for
40 ms after ``nvmlInit``, then 1755 / 1830 MHz in 20 ms turns), memory clock (2619 MHz) and
power (450 W, then 690 W) every 10 ms, stamped in realtime microseconds, the newest 100 kept;
device 1 keeps no buffer; the power-violation counter is the time since 40 ms, in ns.
Timing is bounded as in ``test_emulated_nvml.py``: a figure is asserted where the call's
``[lo, hi]`` window since ``nvmlInit`` pins it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from tests.helpers import emulated_nvml

emulated_nvml_dir = emulated_nvml.emulated_nvml_dir

PRELUDE = """
import json, time
import pynvml

a_wall, a = time.time_ns(), time.monotonic_ns()
pynvml.nvmlInit()
b_wall, b = time.time_ns(), time.monotonic_ns()
init_wall_us = [a_wall // 1000, b_wall // 1000 + 1]

def since_init_ms():
    now = time.monotonic_ns()
    return [(now - b) / 1e6, (now - a) / 1e6]

def samples(handle, kind, last=0):
    try:
        value_type, got = pynvml.nvmlDeviceGetSamples(handle, kind, last)
    except pynvml.NVMLError_NotFound:
        return None, []
    return value_type, [[s.timeStamp, s.sampleValue.uiVal] for s in got]

def error(fn, *args):
    try:
        fn(*args)
    except pynvml.NVMLError as err:
        return type(err).__name__
    return None

h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
"""


def _run(directory: Path, body: str) -> Any:
    done = emulated_nvml.run_with_nvml(directory, PRELUDE + textwrap.dedent(body), timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_buffer_holds_a_sample_every_10_ms_of_clock_memory_clock_and_power(
    emulated_nvml_dir: Path,
) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        time.sleep(0.095)
        before = since_init_ms()
        kinds = (pynvml.NVML_PROCESSOR_CLK_SAMPLES, pynvml.NVML_MEMORY_CLK_SAMPLES,
                 pynvml.NVML_TOTAL_POWER_SAMPLES)
        read = [samples(h0, kind) for kind in kinds]
        after = since_init_ms()
        print(json.dumps({"init_wall_us": init_wall_us, "before": before, "after": after,
                          "types": [t for t, _ in read], "read": [s for _, s in read],
                          "unsigned": pynvml.NVML_VALUE_TYPE_UNSIGNED_INT}))
        """,
    )
    assert got["types"] == [got["unsigned"]] * 3
    sm, mem, power = got["read"]
    first_us = sm[0][0]
    assert got["init_wall_us"][0] <= first_us <= got["init_wall_us"][1]  # sample 0 at init
    for series in (sm, mem, power):
        stamps = [stamp for stamp, _ in series]
        assert stamps == [first_us + 10_000 * k for k in range(len(series))]
        # samples 0..k at k x 10 ms, k the whole 10 ms periods elapsed at the call
        assert int(got["before"][0] // 10) + 1 <= len(series) <= int(got["after"][1] // 10) + 1
    assert [v for _, v in sm] == [emulated_nvml.expected_sm_mhz(10 * k) for k in range(len(sm))]
    assert {v for _, v in mem} == {2619}
    assert [v for _, v in power] == [450_000 if k < 4 else 690_000 for k in range(len(power))]


def test_a_query_returns_only_what_came_after_the_last_stamp_seen(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        kind = pynvml.NVML_PROCESSOR_CLK_SAMPLES
        time.sleep(0.02)
        _, first = samples(h0, kind)
        newest = first[-1][0]
        _, at_once = samples(h0, kind, newest)  # NotFound unless a period ended between calls
        time.sleep(0.035)
        _, later = samples(h0, kind, newest)
        print(json.dumps({"newest": newest, "at_once": at_once, "later": later}))
        """,
    )
    assert len(got["at_once"]) <= 1
    assert len(got["later"]) >= 3  # at least three whole 10 ms periods in 35 ms
    assert all(stamp > got["newest"] for stamp, _ in got["at_once"] + got["later"])


def test_the_buffer_keeps_the_newest_100_and_a_small_array_gets_the_oldest_of_them(
    emulated_nvml_dir: Path,
) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        import ctypes
        time.sleep(1.15)
        _, kept = samples(h0, pynvml.NVML_PROCESSOR_CLK_SAMPLES)
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        kind, count = ctypes.c_uint(), ctypes.c_uint(3)
        array = (pynvml.c_nvmlSample_t * 3)()
        ret = fn(h0, ctypes.c_uint(5), ctypes.c_ulonglong(0), ctypes.byref(kind),
                 ctypes.byref(count), array)
        print(json.dumps({"kept": kept, "ret": ret, "count": count.value,
                          "small": [s.timeStamp for s in array]}))
        """,
    )
    assert len(got["kept"]) == 100
    assert got["kept"][0][0] - got["kept"][-1][0] == -99 * 10_000
    assert got["ret"] == 0 and got["count"] == 3
    assert got["small"][0] >= got["kept"][0][0]  # the oldest kept (a period may have passed)
    assert got["small"] == [got["small"][0] + 10_000 * k for k in range(3)]


def test_refusals_name_the_device_and_the_type(emulated_nvml_dir: Path) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        get = pynvml.nvmlDeviceGetSamples
        print(json.dumps({
            "device1": error(get, h1, pynvml.NVML_PROCESSOR_CLK_SAMPLES, 0),
            "utilization": error(get, h0, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0),
            "out_of_range": error(get, h0, 10, 0),
            "sync_boost": error(pynvml.nvmlDeviceGetViolationStatus, h0, 2),
            "policy_out_of_range": error(pynvml.nvmlDeviceGetViolationStatus, h0, 12),
        }))
        """,
    )
    assert got == {
        "device1": "NVMLError_NotSupported",
        "utilization": "NVMLError_NotSupported",
        "out_of_range": "NVMLError_InvalidArgument",
        "sync_boost": "NVMLError_NotSupported",
        "policy_out_of_range": "NVMLError_InvalidArgument",
    }


def test_the_power_violation_counter_runs_from_40_ms_and_the_thermal_one_stays_at_zero(
    emulated_nvml_dir: Path,
) -> None:
    got = _run(
        emulated_nvml_dir,
        """
        out = []
        for pause in (0.0, 0.08):
            time.sleep(pause)
            before = since_init_ms()
            power = pynvml.nvmlDeviceGetViolationStatus(h1, pynvml.NVML_PERF_POLICY_POWER)
            thermal = pynvml.nvmlDeviceGetViolationStatus(h1, pynvml.NVML_PERF_POLICY_THERMAL)
            after = since_init_ms()
            out.append([before[0], after[1], power.violationTime, thermal.violationTime,
                        power.referenceTime, time.time_ns() // 1000])
        print(json.dumps(out))
        """,
    )
    for lo_ms, hi_ms, power_ns, thermal_ns, reference_us, wall_us in got:
        assert max(lo_ms - 40, 0) * 1e6 <= power_ns <= max(hi_ms - 40, 0) * 1e6
        assert thermal_ns == 0
        assert 0 <= wall_us - reference_us < 1_000_000  # stamped in realtime microseconds
    assert got[1][2] > got[0][2]
