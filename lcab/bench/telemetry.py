"""Clocks, power and energy over each pass's timed repetitions, read beside them.

**Never inside the timed region, and by default nothing beside it.** The sampler is entered
just before the first repetition and left after the last has finished on the device (the timing
protocol synchronises there), and it reads the device at those two ends: the energy counter
(its difference is the window's energy), the clocks, power, temperature and clock-event
reasons, and what the device kept by itself in between (`Source.since`): on a GPU the driver's
own sample buffer of SM clock, memory clock and power (``nvmlDeviceGetSamples``) and its
violation counters, the time spent held down by the power cap or the temperature
(``nvmlDeviceGetViolationStatus``), so a throttle in the middle of the window is seen though no
read happened there. The window holds exactly the timed calls plus what the protocol runs
between them outside each rep's clock (CUDA: the 256 MiB L2-flush memset before every rep;
under CP: the barrier); energy per pass is the window's energy over its repetitions, so the
memsets are charged to the pass — a few microseconds of a 3 TB/s device per rep, stated here
rather than hidden.

**Why not a thread.** A second Python thread costs the pass even while it only waits: each torch
call releases and takes back the GIL, and with another thread alive that handoff is slower — an
idle thread made a 1.2 ms single-threaded matmul 1.4-1.7 % slower on a 2-core VM, a sampler at
10 ms 3.6 %, an NVML one +4.6 % (``python -m lcab.perf telemetry``), over the issue's 1 %. A
thread that polls every ``interval_ms`` remains for a finer clock trace than the driver's buffer
(``bench.telemetry_interval_ms``, off by default).

**A sampler never costs a record, nor hangs a run.** A source whose reads can block (NVML: a
driver call) is read on a short-lived thread at each end, which the caller waits for with a
timeout (`WAIT_S`) and which has returned before the window opens; a host's files (RAPL, cpufreq,
``/proc/cpuinfo``) cannot hang and are read in place. A source that raises gives a reading with a
note; one that does not answer (a hung driver call) is abandoned for the rest of the process (the
thread is a daemon) and every later pass says so.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
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
    buffer_event_bits: int = 0
    """Events the source counted by itself over the window (`WindowBuffer.event_bits`)."""
    events: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why something is missing (one line each)."""

    def clocks(self, attr: str = "clock_mhz") -> tuple[float, float, float] | None:
        """(min, median, max) of a clock over the samples."""
        values = [v for s in self.samples if (v := getattr(s, attr)) is not None]
        if not values:
            return None
        return min(values), statistics.median(values), max(values)

    def event_bits(self) -> int:
        """Every clock-event bit seen: the samples' reasons and the source's own counters."""
        bits = self.buffer_event_bits
        for s in self.samples:
            bits |= s.events
        return bits

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

    def __init__(self, source: Source, interval_ms: float | None = None) -> None:
        self.source = source
        self.interval_s = None if interval_ms is None else interval_ms / 1e3
        self.reading = TelemetryReading(source=source.kind)
        self._ready, self._stop, self._done = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )
        self._energy: list[float | None] = [None, None]
        self._t: list[float] = [0.0, 0.0]
        self._mark: object = None
        blocks = bool(getattr(source, "reads_block", True))
        self.mode = "in place" if not blocks else "ends" if interval_ms is None else "thread"
        """How the device is read: ``in place`` at the window's two ends (a source that cannot
        block), ``ends`` at the two ends each on a short-lived thread with a timeout, or
        ``thread``: a thread reading every ``interval_ms`` while the window is open."""

    @property
    def threaded(self) -> bool:
        """Whether a thread is alive beside the timed repetitions."""
        return self.mode == "thread"

    def __enter__(self) -> Sampler:
        abandoned = _ABANDONED.get(id(self.source))
        if abandoned is not None:
            self.reading.notes.append(abandoned)
            self._done.set()
            return self
        if self.mode == "thread":
            threading.Thread(target=self._run, name="lcab-telemetry", daemon=True).start()
            if not self._ready.wait(WAIT_S):
                self._abandon(f"telemetry off: {self.source.kind} did not open within {WAIT_S:g} s")
        elif self.mode == "ends":
            self._bounded(self._open_window, "did not open")
        else:
            self._guarded(self._open_window)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self.mode == "ends" and not self._done.is_set():
            if not self._bounded(self._close_window, "read did not return"):
                return
        elif self.mode == "in place" and not self._done.is_set():
            self._guarded(self._close_window)
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
        bits = self.reading.event_bits()
        if bits:
            try:
                self.reading.events = self.source.event_names(bits)
            except Exception as err:
                self.reading.notes.append(f"clock-event names: {err}")

    def _abandon(self, note: str) -> None:
        _ABANDONED[id(self.source)] = note + " (earlier in this process)"
        self.reading.notes.append(note)
        self._done.set()  # the thread, if it ever returns, writes into a reading no one reads

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run one end's reads; an error is a note and closes the window."""
        try:
            step()
        except Exception as err:
            self.reading.notes.append(f"{self.source.kind}: {type(err).__name__}: {err}")
            self._done.set()

    def _bounded(self, step: Callable[[], None], what: str) -> bool:
        """`_guarded` on a short-lived thread, waited for `WAIT_S` (False: abandoned)."""
        worker = threading.Thread(
            target=self._guarded, args=(step,), name="lcab-telemetry-end", daemon=True
        )
        worker.start()
        worker.join(WAIT_S)
        if worker.is_alive():
            self._abandon(f"telemetry off: {self.source.kind} {what} within {WAIT_S:g} s")
            return False
        return True

    def _open_window(self) -> None:
        if self._begin():
            self._read_sample()
            self._mark = self.source.mark()
        else:
            self._done.set()

    def _close_window(self) -> None:
        self._read_sample()
        self._take_buffer()
        self._end()
        self._done.set()

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

    def _take_buffer(self) -> None:
        """What the source kept by itself since the window opened: samples, throttles, notes."""
        kept = self.source.since(self._mark)
        self.reading.samples += kept.samples
        self.reading.buffer_event_bits |= kept.event_bits
        self.reading.notes += [n for n in kept.notes if n not in self.reading.notes]

    def _end(self) -> None:
        """The window's last readings: the energy counter, the time, the source's note."""
        self._energy[1] = self.source.energy_j()
        self._t[1] = time.perf_counter()
        note = self.source.energy_note()
        if note is not None:
            self.reading.notes.append(note)

    def _run(self) -> None:
        """The polling thread: first readings, a sample every interval until stopped, last."""
        if not self._begin():
            self._ready.set()
            self._done.set()
            return
        self._ready.set()
        try:
            self._mark = self.source.mark()
            while True:
                self._read_sample()
                if self._stop.wait(self.interval_s):
                    break
            self._take_buffer()
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
