"""What NVML's energy and power readings really resolve on this GPU, measured, not assumed.

    python launchers/nvml_windows.py [OUT.jsonl]

1. The energy counter's update period (``nvmlDeviceGetTotalEnergyConsumption``, mJ) and the
   power reading's (``nvmlDeviceGetPowerUsage``): both polled as fast as the driver answers
   while the GPU runs a steady load; the median time between changes of each.
2. The power reading's averaging window: the GPU idles, then a steady load starts; the time the
   reading takes from the step to 90 % of its plateau (a reading averaged over a window of W
   seconds rises over about W; an instantaneous one at once).
3. Energy per call for three pass lengths (SDPA forward, bf16, 16 heads x 128, 4K/16K/64K tokens):
   the naive figure (the counter's difference around one call) beside the figure over a window
   of 50 counter periods, at most 8 s (the difference over N calls, divided by N).

Each figure is printed and, with OUT, written as one JSON line. Without CUDA (a CPU host, or the
emulated ``libnvidia-ml.so.1`` of the tests) step 1 runs idle and the rest stop, saying so.
Needs ``pynvml`` (PyPI ``nvidia-ml-py``, in the GPU image) and torch.
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

LENGTHS = (4096, 16384, 65536)
HEADS, HEAD_DIM = 16, 128


def change_intervals(read: Callable[[], int], seconds: float) -> list[float]:
    """Seconds between successive changes of ``read()``, polled for ``seconds``."""
    changes, last, end = [], read(), time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        value = read()
        if value != last:
            changes.append(now)
            last = value
    return [b - a for a, b in itertools.pairwise(changes)]


def load(torch: Any) -> Callable[[float], None]:
    """``queue(seconds)``: that much steady GPU work (bf16 matrix products), queued at once."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    a @ a
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    product_s = (time.perf_counter() - start) / 10

    def queue(seconds: float) -> None:
        for _ in range(int(seconds / product_s) + 1):
            a @ a

    return queue


def main(argv: list[str]) -> int:
    """Measure and print; 0 when every step ran, 3 when CUDA was missing for steps 2-3."""
    import pynvml
    import torch

    out = open(argv[0], "a") if argv else None  # noqa: SIM115 (kept open for the whole run)

    def emit(**row: Any) -> None:
        print(json.dumps(row))
        if out:
            out.write(json.dumps(row) + "\n")

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    energy = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # noqa: E731
    power = lambda: pynvml.nvmlDeviceGetPowerUsage(handle)  # noqa: E731
    cuda = torch.cuda.is_available()
    queue = load(torch) if cuda else (lambda seconds: None)

    def under_load(seconds: float, read: Callable[[], int]) -> list[float]:
        queue(seconds)  # ahead of the polling, so the host polls while the GPU works
        intervals = change_intervals(read, seconds)
        if cuda:
            torch.cuda.synchronize()
        return intervals

    name = pynvml.nvmlDeviceGetName(handle)
    for reading, read in (("energy_mj", energy), ("power_mw", power)):
        intervals = under_load(3.0, read)
        period = statistics.median(intervals) if intervals else None
        emit(step="update_period", device=name, reading=reading, loaded=cuda,
             median_s=period, changes=len(intervals))  # fmt: skip
    if not cuda:
        print("nvml_windows: no CUDA device: the averaging window and energy per call need one")
        return 3

    time.sleep(3.0)  # idle, then a step to a steady load
    idle, trace, start = power(), [], time.perf_counter()
    queue(4.0)
    while (now := time.perf_counter() - start) < 4.0:
        trace.append((now, power()))
        time.sleep(0.005)
    torch.cuda.synchronize()
    plateau = statistics.median(p for t, p in trace if t > 3.0)
    rise = next((t for t, p in trace if p - idle >= 0.9 * (plateau - idle)), None)
    emit(step="power_window", device=name, idle_mw=idle, plateau_mw=plateau, to_90pct_s=rise)

    period = statistics.median(under_load(2.0, energy) or [0.1])
    for tokens in LENGTHS:
        q, k, v = (torch.randn(1, HEADS, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))  # fmt: skip
        call = functools.partial(torch.nn.functional.scaled_dot_product_attention, q, k, v)
        call()
        torch.cuda.synchronize()
        before, t0 = energy(), time.perf_counter()
        call()
        torch.cuda.synchronize()
        naive_mj, call_s = energy() - before, time.perf_counter() - t0
        calls = max(10, int(min(50 * period, 8.0) / call_s))  # 50 periods, at most 8 s
        before, t0 = energy(), time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        window_s = time.perf_counter() - t0
        emit(step="energy_per_call", device=name, tokens=tokens, call_ms=1e3 * call_s,
             naive_mj=naive_mj, windowed_mj=(energy() - before) / calls, calls=calls,
             window_s=window_s, counter_periods=window_s / period)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
