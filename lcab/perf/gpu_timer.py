"""The harness against the GPU's own timer: lcab's per-pass time vs ``triton.testing.do_bench``.

Each (kernel, mask, length, pass) is timed on the same prepared call and tensors by lcab's
harness under the paper's protocol and by ``do_bench`` given the same counts, in two rounds of
opposite order, with the SM clock sampled beside each timer; target: within 3 %. Without CUDA it
runs ``ranges`` against ``torch.utils.benchmark.Timer`` (two host clocks, nothing more).
``LCAB_GPU_TIMER_KERNELS=a,b`` narrows the kernels, ``LCAB_GPU_TIMER_OUT=FILE`` writes JSON
lines. Figures: ``lcab/kernels/README.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch

from lcab.bench.inputs import NAMES, SeededInputs
from lcab.bench.pass_telemetry import device_source
from lcab.bench.targets import pass_callable
from lcab.bench.telemetry import Sampler
from lcab.bench.timing import TimingConfig, l2_flush_buffer, measure
from lcab.kernels import Problem, get_kernel
from lcab.kernels.registry import gpu_compared
from lcab.masks import make_mask

MASKS = ("causal", "causal_document")
LENGTHS = (8192, 32768)
PASSES = ("fwd", "bwd")
HEADS_Q, HEADS_KV, HEAD_DIM = 64, 8, 128
PROTOCOL = TimingConfig(warmup=5, reps=20, flush_l2=True)
"""conf/bench/paper.yaml's timing: what a paper-protocol record's median is taken under."""
TARGET = 0.03


@dataclass
class Row:
    """One cell: both medians (ms) and their ratio, or why it has none."""

    kernel: str
    mask: str
    seqlen: int
    pass_: str
    lcab_ms: float | None = None
    reference_ms: float | None = None
    ratio: float | None = None
    reference: str = ""
    note: str = ""
    rounds_ms: list[tuple[float, float]] | None = None
    """(lcab, reference) of each round; the first measures lcab first, the second the reference."""
    clock_mhz: list[tuple[float | None, float | None]] | None = None
    """Median SM clock (CPU: core clock) while each timer of each round ran, as `rounds_ms`."""
    clock_events: list[str] | None = None
    """Clock-event (throttle) reasons NVML reported during the cell's timers."""


Hook = Callable[[], None] | None
Clock = Callable[[Callable[[], object], Hook, list[torch.Tensor], float], float]


def _reference_clock(device: torch.device) -> tuple[str, Clock]:
    """(name, timer(fn, before_each, leaves, call_ms) -> median ms) of the clock lcab is held to.

    do_bench's budgets are in calls of ``call_ms``: its defaults (25 / 100 ms) gave a 30 ms pass
    1 warm-up call and 3 repetitions on an H100.
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        def triton_median(
            fn: Callable[[], object], before_each: Hook, leaves: list[torch.Tensor], call_ms: float
        ) -> float:
            return float(
                do_bench(
                    fn,
                    warmup=max(PROTOCOL.warmup * call_ms, 1.0),
                    rep=max(PROTOCOL.reps * call_ms, 1.0),
                    grad_to_none=leaves or None,
                    return_mode="median",
                )
            )

        return "triton.testing.do_bench", triton_median
    from torch.utils import benchmark

    def torch_timer_ms(
        fn: Callable[[], object], before_each: Hook, leaves: list[torch.Tensor], call_ms: float
    ) -> float:
        def call() -> None:  # the hook inside the timed call: this clock has no untimed slot
            if before_each is not None:
                before_each()
            fn()

        timer = benchmark.Timer("call()", globals={"call": call})
        return float(timer.blocked_autorange().median) * 1e3

    return "torch.utils.benchmark.Timer", torch_timer_ms


def _lcab_p50(
    fn: Callable[[], object], before_each: Hook, device: torch.device, watch: Sampler | None
) -> float:
    """The median lcab records for ``fn`` under the protocol, measured as the runner does."""
    flush = l2_flush_buffer(device) if device.type == "cuda" else None
    return measure(
        fn, PROTOCOL, device=device, before_each=before_each, flush_buffer=flush, watch=watch
    ).p50


class _Clocks:
    """A sampler per timer (lcab's around its repetitions, the reference's around its call)."""

    def __init__(self, device: torch.device) -> None:
        index = (device.index or 0) if device.type == "cuda" else None
        self.source = device_source("auto", device.type, index)
        self.events: set[str] = set()

    def sampler(self) -> Sampler | None:
        return None if self.source is None else Sampler(self.source, interval_ms=5.0)

    def median(self, sampler: Sampler | None) -> float | None:
        if sampler is None:
            return None
        self.events.update(sampler.reading.events)
        clocks = sampler.reading.clocks()
        return None if clocks is None else clocks[1]


def time_cell(
    kernel_name: str, mask_name: str, seqlen: int, device: torch.device, dtype: torch.dtype
) -> list[Row]:
    """Both passes of one cell (rows carry a note instead of times when it cannot run)."""
    rows = [Row(kernel_name, mask_name, seqlen, p) for p in PASSES]
    heads_q, heads_kv, head_dim = (
        (HEADS_Q, HEADS_KV, HEAD_DIM) if device.type == "cuda" else (4, 2, 32)
    )
    problem = Problem(seqlen, seqlen, heads_q, heads_kv, head_dim, dtype, device)
    mask = make_mask(mask_name, seqlen, seed=0)
    kernel = get_kernel(kernel_name)
    clock_name, reference = _reference_clock(device)
    for row in rows:
        row.note = "; ".join(kernel.not_supported_reasons(problem, mask, row.pass_))[:200]
    if all(row.note for row in rows):
        return rows
    try:
        prepared = kernel.prepare(mask, problem)
        source = SeededInputs(seed=0, seqlen=seqlen, sample=0, problem=problem)
        native = {n: prepared.to_native(source.whole(n)) for n in NAMES}
    except Exception as err:  # a kernel that cannot set up says so in its row
        for row in rows:
            row.note = f"setup: {type(err).__name__}: {str(err)[:160]}"
        return rows
    for row in rows:
        if row.note:
            continue
        try:
            fn, before_each, leaves = pass_callable(row.pass_, prepared, native)
            # two rounds in opposite orders: a drifting clock weighs on both timers alike
            clocks = _Clocks(device)
            watches = [clocks.sampler() for _ in range(4)]
            first = _lcab_p50(fn, before_each, device, watches[0])
            with watches[1] or nullcontext():
                second = reference(fn, before_each, leaves, first)
            with watches[2] or nullcontext():
                third = reference(fn, before_each, leaves, first)
            fourth = _lcab_p50(fn, before_each, device, watches[3])
            row.rounds_ms = [(first, second), (fourth, third)]
            mhz = [clocks.median(w) for w in watches]
            row.clock_mhz = [(mhz[0], mhz[1]), (mhz[3], mhz[2])]
            row.clock_events = sorted(clocks.events) or None
            row.lcab_ms = statistics.fmean(r[0] for r in row.rounds_ms)
            row.reference_ms = statistics.fmean(r[1] for r in row.rounds_ms)
            row.ratio = row.lcab_ms / row.reference_ms
            row.reference = clock_name
        except Exception as err:
            row.note = f"{type(err).__name__}: {str(err)[:160]}"
    return rows


def run() -> None:
    """Print lcab / reference for every cell (CUDA: the paper's cells; CPU: a small stand-in)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    chosen = os.environ.get("LCAB_GPU_TIMER_KERNELS")
    kernels = tuple(chosen.split(",")) if chosen else tuple(gpu_compared()) if cuda else ("ranges",)
    lengths = LENGTHS if cuda else (512, 1024)
    where = torch.cuda.get_device_name(0) if cuda else "CPU (host clocks only: not a GPU figure)"
    print(f"harness vs reference clock on {where}; target |lcab/reference - 1| <= {TARGET:.0%}")
    out = os.environ.get("LCAB_GPU_TIMER_OUT")
    rows: list[Row] = []
    for kernel_name in kernels:
        for mask_name in MASKS:
            for seqlen in lengths:
                start = time.perf_counter()
                cell = time_cell(kernel_name, mask_name, seqlen, device, dtype)
                rows += cell
                for row in cell:
                    _print(row, time.perf_counter() - start)
                    if out:
                        with open(out, "a") as fh:
                            fh.write(json.dumps(asdict(row) | {"device": where}) + "\n")
                if cuda:
                    torch.cuda.empty_cache()
    timed = [abs(r.ratio - 1) for r in rows if r.ratio is not None]
    if timed:
        within = sum(d <= TARGET for d in timed)
        print(
            f"within {TARGET:.0%}: {within} of {len(timed)}; median |ratio - 1| "
            f"{statistics.median(timed):.2%}, largest {max(timed):.2%}"
        )


def _print(row: Row, spent_s: float) -> None:
    label = f"{row.kernel:<13} {row.mask:<16} {row.seqlen:>6} {row.pass_:<4}"
    if row.ratio is None:
        print(f"{label} -  {row.note}")
        return
    clocks = ""
    if row.clock_mhz:
        pairs = [f"{_mhz(a)}/{_mhz(b)}" for a, b in row.clock_mhz]
        clocks = f"  clock lcab/ref {', '.join(pairs)} MHz"
        if row.clock_events:
            clocks += f" ({', '.join(row.clock_events)})"
    print(
        f"{label} lcab {row.lcab_ms:9.3f} ms  ref {row.reference_ms:9.3f} ms  "
        f"ratio {row.ratio:6.3f}{clocks}  ({spent_s:.0f} s)"
    )


def _mhz(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"
