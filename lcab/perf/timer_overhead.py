"""The timer's own cost (`lcab.bench.timing.measure`): overhead, agreement with torch's Timer.

Targets: timing an empty function costs < 50 µs per repetition (wall time of ``measure`` / reps
and the recorded median); the median of a ~10 ms CPU workload agrees with
``torch.utils.benchmark.Timer.blocked_autorange`` within 5 %; ``PeakMemory`` sees a ~200 MB
allocation, held or freed inside its region (what it costs the timed calls: ``python -m
lcab.perf telemetry``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils import benchmark

from lcab.bench.memory import PeakMemory
from lcab.bench.timing import TimingConfig, measure
from lcab.kernels.tiled.workers import intra_op_threads

CPU = torch.device("cpu")
TARGET_MS = 10.0


def _empty() -> None:
    return None


def empty_overhead(reps: int = 100_000) -> tuple[float, float, float]:
    """(wall µs per rep of the whole ``measure``, recorded median µs, recorded mean µs)."""
    t0 = time.perf_counter()
    timing = measure(_empty, TimingConfig(warmup=10, reps=reps), device=CPU)
    wall = time.perf_counter() - t0
    return wall / reps * 1e6, timing.p50 * 1e3, statistics.fmean(timing.times_ms) * 1e3


def _matmul(n: int, device: torch.device) -> Callable[[], torch.Tensor]:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    return lambda: a @ b


def sized_matmul(
    target_ms: float = TARGET_MS, device: torch.device = CPU
) -> tuple[Callable[[], torch.Tensor], int]:
    """A float32 square matmul sized at run time to take about ``target_ms`` here, and its n."""
    n = 256
    for _ in range(4):  # cost ~ n^3: rescale from the measured time a few times
        ms = measure(_matmul(n, device), TimingConfig(warmup=2, reps=7), device=device).p50
        n = min(max(64, round(n * (target_ms / ms) ** (1 / 3))), 16384)
    return _matmul(n, device), n


def timer_times_ms(fn: Callable[[], object], min_run_time: float) -> list[float]:
    """Per-call ms from torch's Timer at lcab's thread count (Timer defaults to one thread)."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return [t * 1e3 for t in timer.blocked_autorange(min_run_time=min_run_time).times]


def agreement(fn: Callable[[], object], rounds: int = 30) -> tuple[list[float], list[float]]:
    """(lcab per-rep ms, Timer per-call ms), pooled over short rounds in alternating order.

    Load drifts over seconds (a 10 ms matmul read 9 then 19 ms on the shared 2-core box): short
    interleaved rounds expose both tools to the same load.
    """
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(rounds):
        for turn in (0, 1) if i % 2 == 0 else (1, 0):
            if turn == 0:
                ours.extend(measure(fn, TimingConfig(warmup=1, reps=10), device=CPU).times_ms)
            else:
                theirs.extend(timer_times_ms(fn, min_run_time=0.1))
    return ours, theirs


def rss_delta_mb(hold: bool) -> float:
    """The reported RSS delta (MB) of a region that fills 200 MB, held past it or freed inside."""
    keep = None
    with PeakMemory(CPU) as peak:
        x = torch.ones(50_000_000)  # 200 MB of float32, every page written
        for _ in range(3):
            x.sum()
        if hold:
            keep = x
        del x
    del keep
    return peak.reading.delta_bytes / 1e6


def run() -> None:
    """Print every harness figure."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load} on {os.cpu_count()} CPUs (others' work widens every spread)")
    print("== (1) empty function: cost per repetition (target < 50 us) ==")
    wall, med, mean = empty_overhead()
    print(
        f"measure() wall / reps {wall:7.3f} us   recorded median {med:7.3f} us   "
        f"recorded mean {mean:7.3f} us   (100,000 reps)"
    )
    # one torch thread: with two, a busy core stalls OpenMP's barrier and times swing several-fold
    with intra_op_threads(1):
        _workload_figures()


def _workload_figures() -> None:
    print("\n== (2) agreement with torch.utils.benchmark.Timer (target <= 5 %) ==")
    fn, n = sized_matmul()
    print(f"workload: float32 matmul {n}x{n}, torch threads {torch.get_num_threads()}")
    ours_ms, timer_ms = agreement(fn)
    ours, theirs = statistics.median(ours_ms), statistics.median(timer_ms)
    print(
        f"lcab measure median {ours:7.3f} ms ({len(ours_ms)} reps)   "
        f"Timer.blocked_autorange median {theirs:7.3f} ms ({len(timer_ms)} calls)   "
        f"diff {(ours - theirs) / theirs * 100:+6.2f} %   (30 alternating rounds, pooled)"
    )
    print("\n== (3) PeakMemory: what it sees ==")
    for hold in (True, False):
        what = "held past exit     " if hold else "freed inside region"
        print(f"200 MB tensor {what}  RSS delta {rss_delta_mb(hold):7.1f} MB")
