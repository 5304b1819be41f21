"""Peak memory of a region of code, on the device the benchmark runs on.

CUDA: the caching allocator's peak over the region (lcab's L2-flush buffer left out) and its
reserved rise. CPU: the kernel's own high-water mark of the RSS (reset through
``/proc/self/clear_refs``, read from ``VmHWM``: no thread, no sampling), else the lifetime
``ru_maxrss`` (a lower bound). Process-wide: do not nest regions. Details: the guide,
``lcab/bench/README.md`` ("Measurement protocol").
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


PROC_SELF = Path("/proc/self")


@dataclass(frozen=True)
class MemoryReading:
    """Peak and baseline bytes of one region, and how they were obtained."""

    peak_bytes: int
    baseline_bytes: int
    kind: str
    reserved_bytes: int | None = None
    """CUDA: the rise of the caching allocator's reserved bytes (under CP any rank's largest)."""
    rank: int | None = None
    """Under CP: the rank with the largest peak, this reading's."""
    largest_delta_bytes: int | None = None
    """Under CP: any rank's largest ``peak - baseline`` (perhaps not the peak rank's)."""

    @property
    def delta_bytes(self) -> int:
        """Peak above the baseline (under CP, `largest_delta_bytes`)."""
        if self.largest_delta_bytes is not None:
            return self.largest_delta_bytes
        return self.peak_bytes - self.baseline_bytes


class PeakMemory:
    """Context manager measuring the peak memory of its body; see the module docstring."""

    def __init__(self, device: torch.device, exclude_bytes: int = 0) -> None:
        self.device = torch.device(device)
        self.exclude_bytes = exclude_bytes
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"no memory reading for device type {self.device.type!r}")
        self._reading: MemoryReading | None = None
        self._active = False
        self._kind = ""
        self._baseline = 0
        self._reserved_on_enter = 0

    @property
    def reading(self) -> MemoryReading:
        """The reading of the last completed region."""
        if self._reading is None:
            raise RuntimeError("PeakMemory.reading is available after the region exits")
        return self._reading

    def __enter__(self) -> PeakMemory:
        if self._active:
            raise RuntimeError("PeakMemory region already active")
        self._reading = None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device) - self.exclude_bytes
            self._reserved_on_enter = torch.cuda.memory_reserved(self.device)
        else:
            self._kind = "cpu_hwm" if reset_high_water_mark() else "cpu_maxrss"
            self._baseline = _cpu_peak_bytes(self._kind)
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._active:
            raise RuntimeError("PeakMemory exited without entering")
        self._active = False
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - self.exclude_bytes
            reserved = torch.cuda.max_memory_reserved(self.device) - self._reserved_on_enter
            self._reading = MemoryReading(
                peak, self._baseline, "cuda_max_allocated", reserved_bytes=reserved
            )
            return
        peak = _cpu_peak_bytes(self._kind)
        self._reading = MemoryReading(peak, self._baseline, self._kind)


def reset_high_water_mark() -> bool:
    """Reset the kernel's peak RSS of this process to its current RSS (whether it could)."""
    try:
        (PROC_SELF / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _cpu_peak_bytes(kind: str) -> int:
    """``VmHWM`` of ``/proc/self/status`` (``cpu_hwm``), else the lifetime ``ru_maxrss``."""
    if kind == "cpu_hwm":
        found = re.search(r"^VmHWM:\s+(\d+) kB", (PROC_SELF / "status").read_text(), re.M)
        if found:
            return int(found.group(1)) * 1024
    return _maxrss_bytes()


def _maxrss_bytes() -> int:
    """Lifetime peak RSS of this process (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024
