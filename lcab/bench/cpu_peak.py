"""A CPU host's peak for a pass: its best matmul rate in the dtype computed in, on its threads.

A GPU's share of the peak divides by a rated figure at the measured clock (`lcab.peaks`). A CPU
has no such figure lcab can trust: the FLOP per cycle of a core depends on its vector units
(two 256-bit FMA pipes on AMD Zen 2-4, one or two 512-bit ones on Intel's AVX-512 parts by
SKU, AMX tiles on Sapphire Rapids for bf16), which ``/proc/cpuinfo`` does not tell, and a
virtual machine shows only a nominal clock, below the turbo it runs at. So the peak here is
**measured**, as the Empirical Roofline Toolkit measures its ceilings: the best rate of a square
``torch.matmul`` (MKL / oneDNN, the same libraries attention runs on) on the threads the pass
had, never below the host's nominal FMA rate (below). Attention is matmuls and a softmax, so it
runs below this ceiling; on the 2-core development VM (AMD EPYC) fp32 SDPA reached 0.7 (full)
to 0.9 (causal) of it.

**The dtype computed in.** A CPU kernel given half precision computes in float32 (ATen's
``opmath`` type) unless its backend has a faster native path (AMX, AVX-512 FP16/BF16): on the
development VM, whose CPU has neither, ``torch.matmul`` ran fp16 and bf16 at ~1 GFLOP/s while
SDPA ran them at 15-30, so an fp16 ceiling flagged every fp16 pass. A half-precision pass's
ceiling is therefore the faster of its dtype's matmul and float32's.

**Load.** A call is timed on the process's CPU time over its threads, not the wall clock, and
the best of `CALLS` is kept: time a busy host gives other work is not in it (at load 8-10 on
2 cores the wall clock read 15-25 % of an idle host's rate, CPU time 60-80 %). CPU time
overstates a matmul that leaves some of its threads idle: a higher ceiling, never a false flag.
Nor can load shrink the ceiling below the host's **nominal** FMA rate (`nominal_tflops`: the
threads at the cores' clock, 32 fp32 FLOP a cycle). A pass timed
while the host was busy (load above its cores) runs slower and its share reads low: the record
says so (``peak_basis``).

**Implausible** is above `IMPLAUSIBLE_CPU_SHARE` (1.5) of this ceiling, not above 1: a measured
ceiling is no bound (a pass can beat a noisy probe by a few per cent), but half as fast again as
the host's best matmul is a FLOP count or a timer error — the factor-of-two of a causal mask
counted as full, or of a world size counted twice. Measured once per process, dtype and thread
count (0.1-0.5 s), never inside a timed region: the record's fill calls it after the passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lcab.bench.telemetry_sources import HostSource
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

IMPLAUSIBLE_CPU_SHARE = 1.5
"""A pass above this share of its host's ceiling is flagged (module docstring)."""

SIZES = (256, 1024)
"""The matmul's side, from a first call at the smaller one: the side whose call takes about
`CALL_S` of CPU per thread, in steps of 64 (fp32 on one core here: ~900; fp16, which this
CPU's backend runs at ~1 GFLOP/s, 256 — at 1024 its probe took 15 s)."""

CALL_S = 0.02

CALLS = 6
"""Timed calls after a warm-up one; the best is kept (other work only ever slows one)."""


@dataclass(frozen=True)
class CpuCeiling:
    """The host's dense matmul rate for one dtype and thread count."""

    measured_tflops: float
    dtype: str
    """The dtype of the fastest matmul (float32 for a half-precision pass, where faster)."""
    threads: int
    side: int
    """The square matmul's side it was measured at."""
    nominal_tflops: float | None = None

    @property
    def tflops(self) -> float:
        """The ceiling: the measured rate, or the nominal one where the probe read below it."""
        return max(self.measured_tflops, self.nominal_tflops or 0.0)


_MEASURED: dict[tuple[str, int], CpuCeiling | None] = {}


def cpu_ceiling(dtype: str) -> CpuCeiling | None:
    """The ceiling for ``dtype`` ("float32", ...) on torch's current thread count.

    None: torch has no such dtype, or no CPU matmul in it.
    """
    threads = torch.get_num_threads()
    key = (dtype, threads)
    if key not in _MEASURED:
        kind = getattr(torch, dtype, None)
        _MEASURED[key] = _ceiling(kind, threads) if isinstance(kind, torch.dtype) else None
    return _MEASURED[key]


def nominal_tflops(threads: int, root: Path = Path("/")) -> float | None:
    """The FMA rate of ``threads`` cores at their clock: None where ``/proc/cpuinfo`` is silent.

    32 fp32 FLOP a cycle (two 256-bit FMA pipes: AMD Zen, most Intel cores; a part with two
    512-bit pipes has twice that, and its measured rate stands above this), 16 without FMA.
    """
    try:
        text = (root / "proc/cpuinfo").read_text()
    except OSError:
        return None
    lines = text.splitlines()
    flags = next((line.split(":", 1)[1].split() for line in lines if line[:5] == "flags"), None)
    mhz = HostSource(root).sample(0.0).clock_mhz
    if flags is None or mhz is None:
        return None
    return threads * mhz * 1e6 * (32 if "fma" in flags else 16) / 1e12


def _ceiling(kind: torch.dtype, threads: int) -> CpuCeiling | None:
    """The best of the matmuls in the dtypes ``kind`` may be computed in, and the nominal rate."""
    computed = [kind, torch.float32] if kind in (torch.float16, torch.bfloat16) else [kind]
    measured = {c: m for c in computed if (m := _measure(c, threads)) is not None}
    if not measured:
        return None
    fastest = max(measured, key=lambda c: measured[c][0])
    tflops, side = measured[fastest]
    name = str(fastest).removeprefix("torch.")
    return CpuCeiling(tflops, name, threads, side, nominal_tflops(threads))


def _operands(side: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(side, side, generator=generator).to(dtype)
    return a, torch.randn(side, side, generator=generator).to(dtype)


def _cpu_seconds(call: Callable[[], object], threads: int) -> float:
    """The process's CPU time of one call over its threads (module docstring: load)."""
    start = time.process_time()
    call()
    return max((time.process_time() - start) / threads, 1e-9)


def _measure(dtype: torch.dtype, threads: int) -> tuple[float, int] | None:
    """(TFLOP/s, side) of the best square matmul in ``dtype``; None: the CPU has none."""
    smallest, largest = SIZES
    try:
        a, b = _operands(smallest, dtype)
        torch.matmul(a, b)  # the backend's first call sets itself up
        rate = 2.0 * smallest**3 / _cpu_seconds(lambda: torch.matmul(a, b), threads)
    except RuntimeError:  # a dtype the CPU backend has no matmul for
        return None
    side = int((rate * CALL_S / 2.0) ** (1 / 3) // 64 * 64)
    side = min(max(side, smallest), largest)
    a, b = _operands(side, dtype)
    torch.matmul(a, b)
    best = min(_cpu_seconds(lambda: torch.matmul(a, b), threads) for _ in range(CALLS))
    return 2.0 * side**3 / best / 1e12, side
