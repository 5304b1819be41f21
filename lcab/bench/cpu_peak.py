"""A CPU host's peak for a pass: its own dense matmul rate, in the pass's dtype, on its threads.

A GPU's share of the peak divides by a rated figure at the measured clock (`lcab.peaks`). A CPU
has no such figure lcab can trust: the FLOP per cycle of a core depends on its vector units
(two 256-bit FMA pipes on AMD Zen 2-4, one or two 512-bit ones on Intel's AVX-512 parts by
SKU, AMX tiles on Sapphire Rapids for bf16), which ``/proc/cpuinfo`` does not tell, and a
virtual machine shows only a nominal clock, below the turbo it runs at. So the peak here is
**measured**, as the Empirical Roofline Toolkit measures its ceilings: the best rate of a square
``torch.matmul`` (MKL / oneDNN, the same libraries attention runs on) in the pass's dtype on the
threads the pass had. Attention is matmuls and a softmax, so it runs below this ceiling; on the
2-core development VM (AMD EPYC, Zen 4) fp32 SDPA reached 0.7 (full) to 0.9 (causal) of it.

**Contention.** The matmul is timed on the wall clock, the best of `CALLS` calls: other work on
the host (a CI machine, other ranks of a CP job on the same cores) only ever slows a call, and
the pass itself is timed on the same clock under the same sharing. Process CPU time over the
thread count cannot correct for it: it assumes every thread works the whole call, and for a
1024 bf16 matmul on two threads here it read twice the wall-clock rate.

**Implausible** is above `IMPLAUSIBLE_CPU_SHARE` (1.5) of this ceiling, not above 1: a measured
ceiling is no bound (a pass can beat a noisy probe by a few per cent), but half as fast again as
the host's best matmul is a FLOP count or a timer error — the factor-of-two of a causal mask
counted as full, or of a world size counted twice. Measured once per process, dtype and thread
count (0.1-0.5 s), never inside a timed region: the record's fill calls it after the passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

IMPLAUSIBLE_CPU_SHARE = 1.5
"""A pass above this share of its host's measured matmul rate is flagged (module docstring)."""

SIZES = (256, 1024)
"""The matmul's side, from a first call at the smaller one: the side whose call takes about
`CALL_S`, in steps of 64 (fp32 on one Zen 4 core: ~900; fp16, which this CPU's backend runs at
~1 GFLOP/s, 256 — at 1024 its probe took 15 s)."""

CALL_S = 0.02

CALLS = 6
"""Timed calls after a warm-up one; the best is kept (other work only ever slows one)."""

BASIS = "measured: this host's best dense matmul rate in the dtype on the pass's threads"
"""What a CPU record's ``peak_basis`` says."""


@dataclass(frozen=True)
class CpuCeiling:
    """The host's dense matmul rate for one dtype and thread count."""

    tflops: float
    dtype: str
    threads: int
    side: int
    """The square matmul's side it was measured at."""


_MEASURED: dict[tuple[str, int], CpuCeiling | None] = {}


def cpu_ceiling(dtype: str) -> CpuCeiling | None:
    """The ceiling for ``dtype`` ("float32", ...) on torch's current thread count.

    None: torch has no such dtype, or no CPU matmul in it.
    """
    threads = torch.get_num_threads()
    key = (dtype, threads)
    if key not in _MEASURED:
        kind = getattr(torch, dtype, None)
        _MEASURED[key] = _measure(kind, threads) if isinstance(kind, torch.dtype) else None
    return _MEASURED[key]


def _operands(side: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(side, side, generator=generator).to(dtype)
    return a, torch.randn(side, side, generator=generator).to(dtype)


def _measure(dtype: torch.dtype, threads: int) -> CpuCeiling | None:
    smallest, largest = SIZES
    try:
        a, b = _operands(smallest, dtype)
        torch.matmul(a, b)  # the backend's first call sets itself up
        start = time.perf_counter()
        torch.matmul(a, b)
        rate = 2.0 * smallest**3 / max(time.perf_counter() - start, 1e-9)
    except RuntimeError:  # a dtype the CPU backend has no matmul for
        return None
    side = int((rate * CALL_S / 2.0) ** (1 / 3) // 64 * 64)
    side = min(max(side, smallest), largest)
    a, b = _operands(side, dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(CALLS):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return CpuCeiling(
        tflops=2.0 * side**3 / max(best, 1e-9) / 1e12,
        dtype=str(dtype).removeprefix("torch."),
        threads=threads,
        side=side,
    )
