"""Peak memory of a region of code, on the device the benchmark runs on.

What is measured, per device:

* CUDA (kind ``"cuda_max_allocated"``): bytes held by tensors through PyTorch's caching
  allocator on that device. On enter ``torch.cuda.reset_peak_memory_stats(device)`` and the
  baseline is ``memory_allocated``; on exit the peak is ``max_memory_allocated``. Exact, since
  the allocator counts every allocation, but it excludes blocks the allocator caches while
  free, the CUDA context, and memory obtained outside the allocator (e.g. NCCL's own buffers).
  The peak statistics are per device and process-wide: do not nest regions on one device.
  Bytes the benchmark itself keeps live through the region (the 256 MiB L2-flush buffer,
  allocated before it: ``exclude_bytes``) are taken out of the allocated figures, so a
  reading is the kernel's, not lcab's. The caching allocator's reserved bytes are read as a
  delta too: ``max_memory_reserved`` over the region minus ``memory_reserved`` on enter
  (``reset_peak_memory_stats`` starts the peak there), i.e. how much more the region made the
  process hold from the device, fragmentation included. What the allocator held on enter —
  the flush buffer's segment, the inputs, blocks cached by earlier lengths or passes — is not
  in it; cached blocks the region reused cost it nothing, so the delta can be smaller than the
  allocated one.
* CPU (kind ``"cpu_hwm"``): the kernel's own high-water mark of this process's resident set
  size. On enter, writing ``5`` to ``/proc/self/clear_refs`` resets it to the current RSS (the
  baseline, Linux 4.0+, ``proc(5)``); on exit ``VmHWM`` of ``/proc/self/status`` is the peak.
  Nothing runs beside the region — no thread, no sampling: the kernel notes the peak itself,
  however short, to the page. RSS counts pages touched, not bytes requested (an ``empty``
  tensor never written adds almost nothing), and includes whatever the process keeps resident:
  allocator caching (glibc keeps small freed blocks; large ones are ``mmap``-ed and returned on
  free), other threads, Python objects, library pages first touched in the region. The mark is
  the process's: do not nest regions.
* CPU where the mark cannot be reset (no ``/proc``, or a kernel that refuses it; kind
  ``"cpu_maxrss"``): ``resource.getrusage`` ``ru_maxrss``, the process's lifetime high-water
  mark, at the two ends. The peak is right only if the region set a new record; the baseline is
  the earlier record, so the delta is a lower bound (zero when the region stayed under an
  earlier peak).
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
    """CUDA: peak bytes the caching allocator reserved above what it held on enter (under CP
    the largest of any rank); None on CPU."""
    rank: int | None = None
    """Under CP: the rank this reading is from (the one with the largest peak)."""
    largest_delta_bytes: int | None = None
    """Under CP: the largest ``peak - baseline`` of any rank (may be another rank's than the
    peak's: a rank with large inputs and a small kernel peak holds the peak)."""

    @property
    def delta_bytes(self) -> int:
        """Peak above the baseline: what the region added at its highest point.

        Under CP the largest of any rank (`largest_delta_bytes`), not the peak rank's own.
        """
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
