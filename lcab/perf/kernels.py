"""Kernel figures on CPU: whether the cost of ``ranges`` follows the attended area.

Targets at S = 16,384 (fp32, 8:2 heads, D 64, ProLong64K documents): ``ranges`` on
``causal_document`` reaches at least half of ``sdpa``'s GFLOP/s on ``full`` (its time follows
the area), and is at least 5× faster than ``sdpa`` with that mask as a dense bool mask. Both
passes, prepared outside the timer, in interleaved rounds so load drift hits every kernel alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Literal

import torch

from lcab.bench.timing import TimingConfig, measure
from lcab.flops import attention_flops
from lcab.kernels import Problem, get_kernel
from lcab.masks import make_mask
from lcab.masks.core import AttnMask

CPU = torch.device("cpu")
PASS_FWD: Literal["fwd"] = "fwd"
PASS_BWD: Literal["bwd"] = "bwd"
SEQLEN = 16384


def _calls(kernel: str, mask: AttnMask, problem: Problem) -> tuple[Callable[[], object], ...]:
    """(forward call, backward call) on fixed random inputs, prepared outside the timer."""
    prepared = get_kernel(kernel).prepare(mask, problem)
    gen = torch.Generator().manual_seed(0)
    shapes = [
        (SEQLEN, h, problem.head_dim) for h in (problem.heads_q, problem.heads_kv, problem.heads_kv)
    ]
    q, k, v = (prepared.to_native(torch.randn(*s, generator=gen)) for s in shapes)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out, _ = prepared.run(*leaves)
    dout = torch.randn_like(out)

    def forward() -> object:
        with torch.no_grad():
            return prepared.run(q, k, v)

    def backward() -> object:
        for t in leaves:
            t.grad = None
        out.backward(dout, retain_graph=True)
        return None

    return forward, backward


def run(rounds: int = 5) -> None:
    """Print the figures and the targets."""
    problem = Problem(SEQLEN, SEQLEN, 8, 2, 64, torch.float32, CPU)
    doc = make_mask("causal_document", SEQLEN, seed=0)
    full = make_mask("full", SEQLEN)
    print(
        f"S={SEQLEN}, fp32, heads 8:2, D 64; causal_document: {doc.num_docs} documents "
        f"(ProLong64K lengths, seed 0), density {doc.density():.4f}"
    )
    cases = [
        ("sdpa, full (no mask)", "sdpa", full),
        ("ranges, causal_document", "ranges", doc),
        ("sdpa, causal_document (dense bool mask)", "sdpa", doc),
    ]
    start = time.perf_counter()
    calls = {label: _calls(kernel, mask, problem) for label, kernel, mask in cases}
    times: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _, _ in cases}
    config = TimingConfig(warmup=1, reps=3)
    for i in range(rounds):
        order = cases if i % 2 == 0 else cases[::-1]
        for label, _, _ in order:
            forward, backward = calls[label]
            times[label][0].extend(measure(forward, config, device=CPU).times_ms)
            times[label][1].extend(measure(backward, config, device=CPU).times_ms)
    print(f"{'case':<42}{'fwd ms':>10}{'fwd GFLOP/s':>13}{'bwd ms':>10}{'bwd GFLOP/s':>13}")
    gflops = {}
    for label, _, mask in cases:
        row = f"{label:<42}"
        fwd, bwd = times[label]
        for pass_, pass_times in ((PASS_FWD, fwd), (PASS_BWD, bwd)):
            ms = statistics.median(pass_times)
            rate = attention_flops(mask, 8, 64, pass_=pass_) / (ms * 1e-3) / 1e9
            gflops[label, pass_] = (ms, rate)
            row += f"{ms:>10.1f}{rate:>13.1f}"
        print(row)
    full_label, ranges_label, dense_label = (c[0] for c in cases)
    for pass_ in ("fwd", "bwd"):
        ratio = gflops[ranges_label, pass_][1] / gflops[full_label, pass_][1]
        speedup = gflops[dense_label, pass_][0] / gflops[ranges_label, pass_][0]
        print(
            f"{pass_}: ranges effective GFLOP/s / sdpa-full GFLOP/s = {ratio:.2f} "
            f"(target >= 0.5); ranges vs sdpa dense-mask speed-up = {speedup:.1f}x (target >= 5x)"
        )
    print(f"({rounds} interleaved rounds x 3 reps per case; {time.perf_counter() - start:.0f} s)")
