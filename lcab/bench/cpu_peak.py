"""A CPU host's peak for a pass: its best matmul rate in the dtype computed in, on its threads.

A CPU has no rated figure lcab can trust, so the ceiling is **measured**, as the Empirical Roofline
Toolkit does: the best square ``torch.matmul`` on the pass's threads, on CPU time (a busy host's
other work left out), never below the nominal FMA rate; a half-precision pass gets the faster of its
dtype's and float32's. Implausible is above 1.5 of it, not 1: a measured ceiling is no bound, but
half as fast again is a FLOP count or timer error. Figures: the guide, ``lcab/bench/README.md``
("Measurement protocol").
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
"""The side range of a matmul taking about `CALL_S` of CPU (a slow fp16 took 15 s at 1024)."""

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
    nominal_tflops: float | None = None

    @property
    def tflops(self) -> float:
        """The ceiling: the measured rate, or the nominal one where the probe read below it."""
        return max(self.measured_tflops, self.nominal_tflops or 0.0)


_MEASURED: dict[tuple[str, int], CpuCeiling | None] = {}


def cpu_ceiling(dtype: str) -> CpuCeiling | None:
    """The ceiling for ``dtype`` on torch's thread count (None: no CPU matmul in that dtype)."""
    threads = torch.get_num_threads()
    key = (dtype, threads)
    if key not in _MEASURED:
        kind = getattr(torch, dtype, None)
        _MEASURED[key] = _ceiling(kind, threads) if isinstance(kind, torch.dtype) else None
    return _MEASURED[key]


def nominal_tflops(threads: int, root: Path = Path("/")) -> float | None:
    """The FMA rate of ``threads`` cores at their clock: None where ``/proc/cpuinfo`` is silent.

    32 fp32 FLOP a cycle (two 256-bit FMA pipes: AMD Zen, most Intel cores), 16 without FMA.
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
    """The process's CPU time of one call over its threads."""
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
