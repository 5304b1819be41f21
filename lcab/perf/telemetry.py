"""What the telemetry sampler costs a timed pass: ``python -m lcab.perf telemetry``.

A ~1 ms float32 matmul is timed in shuffled rounds without a sampler and with each one (`SAMPLERS`,
the runner's ``PeakMemory`` too); the figure is the median of each round's with / without ratio
with a distribution-free 95 % interval, against a target of 1 %. ``LCAB_PERF_ROUNDS`` (240 of 50
reps); ``LCAB_PERF_TELEMETRY=nvml`` samples NVML. Figures: ``lcab/bench/README.md``.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from contextlib import nullcontext

import torch

from lcab.bench.memory import PeakMemory
from lcab.bench.pass_telemetry import device_source
from lcab.bench.telemetry import Sampler
from lcab.bench.timing import TimingConfig, measure
from lcab.perf.timer_overhead import sized_matmul

ROUNDS = int(os.environ.get("LCAB_PERF_ROUNDS", "240"))
SAMPLERS = [s.strip() for s in os.environ.get("LCAB_PERF_SAMPLERS", "").split(",") if s.strip()]
"""Which samplers to time beside ``off`` (``ends``, ``10 ms``, ``1 ms``, ``memory``; all)."""
TARGET = 0.01
PROTOCOL = TimingConfig(warmup=10, reps=50, flush_l2=False)


def run() -> None:
    """Print the sampler's cost per pass read at the ends and polled, and one read's cost."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(1)
    mode = os.environ.get("LCAB_PERF_TELEMETRY", "auto")
    source = device_source(mode, device.type, 0 if cuda or mode == "nvml" else None)
    if source is None:
        print("telemetry off: nothing to measure")
        return
    call, _ = sized_matmul(1.0, device)
    with Sampler(source) as probe:
        pass
    print(f"source {source.kind}: {probe.reading.device_name or device.type}")
    for note in probe.reading.notes:
        print(f"  note: {note}")
    t0 = time.perf_counter()
    for i in range(200):
        source.sample(float(i))
    per_sample_us = (time.perf_counter() - t0) / 200 * 1e6
    t0 = time.perf_counter()
    for _ in range(50):
        with Sampler(source):
            pass
    ends_us = (time.perf_counter() - t0) / 50 * 1e6
    default = Sampler(source).mode
    print(
        f"one sample() call: {per_sample_us:.1f} us; a window's two ends ({default}): "
        f"{ends_us:.0f} us, outside the timed region"
    )
    polled = Sampler(source, 10.0).threaded  # a source read on a thread can also be polled
    labels = ["off", "ends", "10 ms", "1 ms"] if polled else ["off", "ends"]
    labels.append("memory")
    if SAMPLERS:
        labels = ["off", *(label for label in labels[1:] if label in SAMPLERS)]
    rounds: dict[str, list[float]] = {label: [] for label in labels}
    order = random.Random(0)
    for _ in range(ROUNDS):  # each round times the three in a fresh order: drift weighs alike
        shuffled = list(rounds)
        order.shuffle(shuffled)
        for label in shuffled:
            watch = (
                None
                if label in ("off", "memory")
                else Sampler(source)
                if label == "ends"
                else Sampler(source, float(label.split()[0]))
            )
            # the memory reading wraps the first call, warm-up and repetitions, as the runner's
            with PeakMemory(device) if label == "memory" else nullcontext():
                timing = measure(call, PROTOCOL, device=device, watch=watch)
            rounds[label].append(timing.p50)
    base = statistics.median(rounds["off"])
    print(f"pass of {base:.3f} ms (median of {ROUNDS} rounds x {PROTOCOL.reps} reps)")
    for label in labels[1:]:
        ratios = [w / o for w, o in zip(rounds[label], rounds["off"], strict=True)]
        cost = statistics.median(ratios) - 1  # the round's own pair: drift between rounds cancels
        low, high = (bound - 1 for bound in median_interval(ratios))
        verdict = "met" if high < TARGET else "MISSED" if low >= TARGET else "not shown"
        print(
            f"sampler {label if label in ('ends', 'memory') else 'every ' + label:>11}: "
            f"{statistics.median(rounds[label]):.3f} ms, median of "
            f"the rounds' ratios {cost:+.2%}, 95 % interval {low:+.2%} to {high:+.2%} "
            f"(target < {TARGET:.0%}: {verdict})"
        )
    one, five, _ = os.getloadavg()
    print(f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs")


def median_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: two order statistics of ``values``.

    Values below the median are binomial (n, 1/2): the k-th smallest and largest bracket it at
    about ``z``'s confidence (normal approximation). Fewer than 6 values give their whole range.
    """
    ordered = sorted(values)
    n = len(ordered)
    k = max(int(n / 2 - z * n**0.5 / 2), 0)
    return ordered[k], ordered[n - 1 - k]
