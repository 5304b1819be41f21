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
* CPU (kind ``"cpu_rss_sampled"``): the resident set size of this whole process, read from
  ``/proc/self/statm`` (resident pages x page size) once on enter, every ``interval_s`` by a
  daemon thread, and once on exit; the peak is the largest sample. RSS counts pages touched,
  not bytes requested (an ``empty`` tensor never written adds almost nothing), and includes
  whatever the process keeps resident: allocator caching (glibc keeps small freed blocks;
  large ones are ``mmap``-ed and returned on free), other threads, Python objects, library
  pages first touched in the region. A peak shorter than the sampling gap can be missed, so the
  reading is a lower bound on the true peak.
* CPU without ``/proc`` (kind ``"cpu_maxrss"``): ``resource.getrusage`` ``ru_maxrss``, the
  process's lifetime high-water mark, sampled the same way. The peak is right only if the
  region set a new record; the baseline is the earlier record, so the delta is a lower bound
  (zero when the region stayed under an earlier peak).

The sampler sleeps between samples and a read costs a few microseconds under the GIL. Each
wake-up still costs the machine roughly 30 µs of CPU (about 3 % of one core at the default
1 ms), which shows up only when every core is busy; raise ``interval_s`` there.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


SAMPLER_THREAD_NAME = "lcab-peak-memory"
_STATM = "/proc/self/statm"
_SLEEP_UP_TO_S = 0.01  # intervals up to this sleep plainly; exit may wait one interval


@dataclass(frozen=True)
class MemoryReading:
    """Peak and baseline bytes of one region, and how they were obtained."""

    peak_bytes: int
    baseline_bytes: int
    kind: str
    samples: int
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

    def __init__(
        self, device: torch.device, interval_s: float = 0.001, exclude_bytes: int = 0
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.device = torch.device(device)
        self.exclude_bytes = exclude_bytes
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"no memory reading for device type {self.device.type!r}")
        self.interval_s = interval_s
        self._reading: MemoryReading | None = None
        self._active = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._read: Callable[[], int] = _maxrss_bytes
        self._close: Callable[[], None] = _nothing
        self._kind = ""
        self._baseline = 0
        self._reserved_on_enter = 0
        self._peak = 0
        self._samples = 0

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
            self._active = True
            return self
        self._kind, self._read, self._close = _rss_source()
        try:
            self._baseline = self._peak = self._read()
        except BaseException:
            self._close()
            raise
        self._samples = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._sample, args=(self._stop,), name=SAMPLER_THREAD_NAME, daemon=True
        )
        self._thread.start()
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
                peak, self._baseline, "cuda_max_allocated", 1, reserved_bytes=reserved
            )
            return
        thread, self._thread = self._thread, None
        assert thread is not None  # set by __enter__ on CPU
        self._stop.set()
        thread.join()  # prompt: within one interval <= 10 ms, or at once via the event
        try:
            self._peak = max(self._peak, self._read())
            self._samples += 1
        finally:
            self._close()
        self._reading = MemoryReading(self._peak, self._baseline, self._kind, self._samples)

    def _sample(self, stop: threading.Event) -> None:
        """Sampler thread body: never raises; a failed read ends sampling, enter/exit stand.

        Short intervals sleep with ``time.sleep`` (measured a quarter to a third cheaper per
        wake-up than ``Event.wait``, which allocates a lock each time) and see the stop flag
        within one interval; long intervals wait on the event so exit stays prompt.
        """
        interval = self.interval_s
        try:
            if interval <= _SLEEP_UP_TO_S:
                while not stop.is_set():
                    time.sleep(interval)
                    self._take_sample()
            else:
                while not stop.wait(interval):
                    self._take_sample()
        except Exception:
            return

    def _take_sample(self) -> None:
        value = self._read()
        self._samples += 1
        if value > self._peak:
            self._peak = value


def _nothing() -> None:
    return None


def _rss_source() -> tuple[str, Callable[[], int], Callable[[], None]]:
    """(kind, reader of bytes, closer): statm on a kept-open descriptor, else ru_maxrss."""
    try:
        fd = os.open(_STATM, os.O_RDONLY)
    except OSError:
        _maxrss_bytes()  # fail on enter, not in the thread, if there is no source at all
        return "cpu_maxrss", _maxrss_bytes, _nothing
    page = os.sysconf("SC_PAGE_SIZE")

    def read() -> int:
        # statm: "size resident shared text lib data dt", in pages; pread avoids reopening.
        return int(os.pread(fd, 256, 0).split()[1]) * page

    def close() -> None:
        os.close(fd)

    return "cpu_rss_sampled", read, close


def _maxrss_bytes() -> int:
    """Lifetime peak RSS of this process (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024
