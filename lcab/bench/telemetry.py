"""Clocks, power and energy over each pass's timed repetitions, sampled beside them.

**Never inside the timed region.** A background thread reads the device every
``interval_ms`` while the repetitions run; the timed loop itself gains no call. The energy
counter is read once just before the first repetition and once after the last one has finished
on the device (the timing protocol synchronises there), so the window holds exactly the timed
calls, plus what the protocol runs between them outside each rep's clock (CUDA: the 256 MiB
L2-flush memset before every rep; under CP: the barrier). Energy per pass is the window's energy
over its repetitions, so the memsets are charged to the pass: a few microseconds of a 3 TB/s
device per rep, which this module states rather than hides.

**A sampler never costs a record, nor hangs a run.** A source whose reads can block (NVML:
a driver call) is read only on the thread, also the library's loading and the first and last
energy readings; the caller waits for them with a timeout (`WAIT_S`). A source that raises
gives a reading with a note; one that does not answer (a hung driver call) is abandoned for the
rest of the process (the thread is a daemon) and every later pass says so.

**A host is read in place, at the window's two ends.** A second Python thread costs a CPU pass
even while it only waits: each torch call releases and takes back the GIL, and with another
thread alive that handoff is slower — an idle thread made a 1.2 ms single-threaded matmul
1.4-1.7 % slower on a 2-core VM, the sampler at 10 ms 3.6 % (``python -m lcab.perf
telemetry``). A host's readings are the kernel's files (RAPL's energy counter, cpufreq or
``/proc/cpuinfo`` clocks), which cannot hang and need no sampling between the ends: the energy
is the counter's difference (one wrap is recognised), the clock its two readings. So
`HostSource` (``reads_block`` False) is read on the calling thread just before the first
repetition and just after the last, and a CPU pass runs with no thread beside it.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

from lcab.bench.telemetry_sources import Sample, Source, TelemetryUnavailableError

WAIT_S = 2.0
"""How long the caller waits for the thread to open the source and to take its last reading."""

_ABANDONED: dict[int, str] = {}
"""Sources (by id) whose thread did not answer: never sampled again in this process."""


@dataclass
class TelemetryReading:
    """What one window of timed repetitions read; None where the source did not say."""

    source: str
    device_name: str | None = None
    window_s: float | None = None
    energy_j: float | None = None
    """Energy of the whole window (all repetitions)."""
    samples: list[Sample] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why something is missing (one line each)."""

    def clocks(self, attr: str = "clock_mhz") -> tuple[float, float, float] | None:
        """(min, median, max) of a clock over the samples."""
        values = [v for s in self.samples if (v := getattr(s, attr)) is not None]
        if not values:
            return None
        return min(values), statistics.median(values), max(values)

    def power_w(self) -> float | None:
        """Mean power: the energy over the window where the counter exists, else the samples'."""
        if self.energy_j is not None and self.window_s:
            return self.energy_j / self.window_s
        values = [s.power_w for s in self.samples if s.power_w is not None]
        return statistics.fmean(values) if values else None

    def temperature_c(self) -> float | None:
        """The hottest sample."""
        values = [s.temperature_c for s in self.samples if s.temperature_c is not None]
        return max(values) if values else None


class Sampler:
    """``with Sampler(source):`` around the timed repetitions; ``reading`` afterwards."""

    def __init__(self, source: Source, interval_ms: float = 10.0) -> None:
        self.source, self.interval_s = source, interval_ms / 1e3
        self.reading = TelemetryReading(source=source.kind)
        self._ready, self._stop, self._done = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )
        self._energy: list[float | None] = [None, None]
        self._t: list[float] = [0.0, 0.0]
        self._thread = threading.Thread(target=self._run, name="lcab-telemetry", daemon=True)
        self.threaded = bool(getattr(source, "reads_block", True))
        """Read on a thread (a source whose reads can block); else at the window's two ends."""

    def __enter__(self) -> Sampler:
        abandoned = _ABANDONED.get(id(self.source))
        if abandoned is not None:
            self.reading.notes.append(abandoned)
            self._done.set()
            return self
        if not self.threaded:
            if self._begin():
                self._read_sample()
            else:
                self._done.set()
            return self
        self._thread.start()
        if not self._ready.wait(WAIT_S):
            self._abandon(f"telemetry off: {self.source.kind} did not open within {WAIT_S:g} s")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if not self.threaded and not self._done.is_set():
            try:
                self._read_sample()
                self._end()
            except Exception as err:
                self.reading.notes.append(f"{self.source.kind}: {type(err).__name__}: {err}")
            self._done.set()
        if not self._done.is_set() and not self._done.wait(WAIT_S):
            self._abandon(
                f"telemetry off: a {self.source.kind} read did not return within {WAIT_S:g} s"
            )
            return
        start, end = self._energy
        if start is not None and end is not None:
            self.reading.energy_j = end - start
        if self._t[1] > self._t[0]:
            self.reading.window_s = self._t[1] - self._t[0]
        bits = 0
        for s in self.reading.samples:
            bits |= s.events
        if bits:
            try:
                self.reading.events = self.source.event_names(bits)
            except Exception as err:
                self.reading.notes.append(f"clock-event names: {err}")

    def _abandon(self, note: str) -> None:
        _ABANDONED[id(self.source)] = note + " (earlier in this process)"
        self.reading.notes.append(note)
        self._done.set()  # the thread, if it ever returns, writes into a reading no one reads

    def _begin(self) -> bool:
        """Open the source and take the window's first readings (False: a note says why not)."""
        reading = self.reading
        try:
            self.source.open()
            reading.device_name = self.source.device_name()
            self._energy[0] = self.source.energy_j()
            self._t[0] = time.perf_counter()
        except TelemetryUnavailableError as err:
            reading.notes.append(str(err))
            return False
        except Exception as err:
            reading.notes.append(f"{self.source.kind}: {type(err).__name__}: {err}")
            return False
        return True

    def _read_sample(self) -> None:
        self.reading.samples.append(self.source.sample(time.perf_counter() - self._t[0]))

    def _end(self) -> None:
        """The window's last readings: the energy counter, the time, the source's note."""
        self._energy[1] = self.source.energy_j()
        self._t[1] = time.perf_counter()
        note = self.source.energy_note()
        if note is not None:
            self.reading.notes.append(note)

    def _run(self) -> None:
        """The thread: first readings, a sample every interval until stopped, last readings."""
        if not self._begin():
            self._ready.set()
            self._done.set()
            return
        self._ready.set()
        try:
            while True:
                self._read_sample()
                if self._stop.wait(self.interval_s):
                    break
            self._end()
        except Exception as err:
            self.reading.notes.append(f"{self.source.kind}: {type(err).__name__}: {err}")
        finally:
            self._done.set()


def open_check(source: Source) -> str | None:
    """Whether ``source`` opens (None) or why not, in one line (raises nothing)."""
    try:
        source.open()
    except TelemetryUnavailableError as err:
        return str(err)
    except Exception as err:
        return f"{source.kind}: {type(err).__name__}: {err}"
    return None
