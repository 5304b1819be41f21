"""Clocks, power and energy of each pass, read beside its timed repetitions and after them.

Never inside the timed region: the device is read at the window's two ends, plus what it kept by
itself in between (NVML's sample buffer and violation counters). Energy comes from an untimed window
of its own, `ENERGY_STEPS` of its counter's 20-100 ms steps long. No thread runs beside the pass by
default: an idle one made a 1.2 ms matmul 1.4-1.7 % slower on a 2-core VM (``python -m lcab.perf
telemetry``). A blocking read runs on a thread waited for `WAIT_S`; one that hangs is abandoned for
the process. The whole protocol: the guide, ``lcab/bench/README.md`` ("Measurement protocol").
"""

from __future__ import annotations

import math
import statistics
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import TracebackType

from lcab.bench.telemetry_sources import Sample, Source, TelemetryUnavailableError

WAIT_S = 2.0
"""How long the caller waits for the thread to open the source and to take its last reading."""

ENERGY_STEPS = 10
"""An energy window spans at least this many steps of its counter (module docstring)."""

ENERGY_MARGIN = 1.25
"""The energy window runs calls for this much more than its minimum length."""

ENERGY_ROUNDS = 4
"""At most this many rounds of calls fill an energy window (`energy_calls`)."""

_ABANDONED: weakref.WeakKeyDictionary[Source, str] = weakref.WeakKeyDictionary()
"""Sources whose thread did not answer, never sampled again (weak keys: no reused ``id``)."""


def energy_calls(source: Source, per_call_ms: float, spent_ms: float = 0.0) -> int:
    """How many more calls of ``per_call_ms`` fill an energy window ``spent_ms`` along.

    The first round is counted at the timed median, the next ones at the rate the window's own
    calls ran (a host whose load fell since the timed calls runs them faster).
    """
    left_ms = ENERGY_MARGIN * ENERGY_STEPS * source.energy_step_s * 1e3 - spent_ms
    return max(0, math.ceil(left_ms / max(per_call_ms, 1e-3)))


@dataclass
class TelemetryReading:
    """What one window read; None where the source did not say."""

    source: str
    device_name: str | None = None
    window_s: float | None = None
    energy_j: float | None = None
    """The energy counter's difference over the window (see `window_energy_j`)."""
    energy_min_s: float = 0.0
    """The shortest window whose counter difference is its energy (`ENERGY_STEPS` steps)."""
    calls: int | None = None
    """The calls the window holds (an energy window's)."""
    power_limit_w: float | None = None
    samples: list[Sample] = field(default_factory=list)
    """The window's end reads and the samples taken inside it, ``t_s`` from its opening."""
    buffer_event_bits: int = 0
    """Events the source counted by itself over the window (`WindowBuffer.event_bits`)."""
    events: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why something is missing (one line each)."""

    def inside(self, attr: str = "clock_mhz") -> list[float]:
        """``attr`` of the samples stamped inside the window (not its end reads)."""
        end = self.window_s or 0.0
        return [v for s in self.samples if 0 < s.t_s < end and (v := getattr(s, attr)) is not None]

    def _values(self, attr: str) -> list[float]:
        """``attr`` inside the window, else at its two ends."""
        return self.inside(attr) or [v for s in self.samples if (v := getattr(s, attr)) is not None]

    def clocks(self, attr: str = "clock_mhz") -> tuple[float, float, float] | None:
        """(min, median, max) of a clock inside the window, else at its two ends."""
        values = self._values(attr)
        if not values:
            return None
        return min(values), statistics.median(values), max(values)

    def event_bits(self) -> int:
        """Every clock-event bit seen: the samples' reasons and the source's own counters."""
        bits = self.buffer_event_bits
        for s in self.samples:
            bits |= s.events
        return bits

    def window_energy_j(self) -> float | None:
        """The window's energy, where it is long enough for its counter (`energy_min_s`)."""
        if self.energy_j is None or (self.window_s or 0.0) < self.energy_min_s:
            return None
        return self.energy_j

    def power_w(self) -> float | None:
        """Mean power: the window's energy over its length where it has one, else the samples'."""
        energy = self.window_energy_j()
        if energy is not None and self.window_s:
            return energy / self.window_s
        values = self._values("power_w")
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
        self.reading = TelemetryReading(
            source=source.kind, energy_min_s=ENERGY_STEPS * source.energy_step_s
        )
        self._ready, self._stop, self._done = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )
        self._energy: list[float | None] = [None, None]
        self._t: list[float] = [0.0, 0.0]
        """The wall clock (``time.time``, as the driver stamps its samples) at the two ends."""
        self._mark: object = None
        blocks = bool(getattr(source, "reads_block", True))
        self.mode = "in place" if not blocks else "ends" if interval_ms is None else "thread"
        """``in place`` (cannot block), ``ends`` (each end on a thread), ``thread`` (polling)."""

    @property
    def threaded(self) -> bool:
        """Whether a thread is alive beside the timed repetitions."""
        return self.mode == "thread"

    def __enter__(self) -> Sampler:
        abandoned = _ABANDONED.get(self.source)
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
        reading, (opened, closed) = self.reading, self._t
        start, end = self._energy
        if start is not None and end is not None:
            reading.energy_j = end - start
        if closed > opened:
            reading.window_s = closed - opened
        reading.samples = [replace(s, t_s=s.t_s - opened) for s in reading.samples]
        bits = reading.event_bits()
        if bits:
            try:
                reading.events = self.source.event_names(bits)
            except Exception as err:
                reading.notes.append(f"clock-event names: {err}")

    def _abandon(self, note: str) -> None:
        _ABANDONED[self.source] = note + " (earlier in this process)"
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
        if not self._begin():
            self._done.set()

    def _close_window(self) -> None:
        self._end()
        self._read_sample()
        self._take_buffer()
        self._done.set()

    def _begin(self) -> bool:
        """Open the source, read it, then open the window (False: a note says why not)."""
        reading = self.reading
        try:
            self.source.open()
            reading.device_name = self.source.device_name()
            reading.power_limit_w = self.source.power_limit_w()
            self._read_sample()
            self._mark = self.source.mark()
            self._t[0] = time.time()
            self._energy[0] = self.source.energy_j()  # the last read: the window opens here
        except TelemetryUnavailableError as err:
            reading.notes.append(str(err))
            return False
        except Exception as err:
            reading.notes.append(f"{self.source.kind}: {type(err).__name__}: {err}")
            return False
        return True

    def _read_sample(self) -> None:
        self.reading.samples.append(self.source.sample(time.time()))

    def _take_buffer(self) -> None:
        """What the source kept by itself inside the window: samples, throttles, notes."""
        kept, (opened, closed) = self.source.since(self._mark), self._t
        self.reading.samples += [s for s in kept.samples if opened < s.t_s < closed]
        self.reading.buffer_event_bits |= kept.event_bits
        self.reading.notes += [n for n in kept.notes if n not in self.reading.notes]

    def _end(self) -> None:
        """Close the window: the energy counter first, the time, the source's note."""
        self._energy[1] = self.source.energy_j()
        self._t[1] = time.time()
        note = self.source.energy_note()
        if note is not None:
            self.reading.notes.append(note)

    def _run(self) -> None:
        """The polling thread: the window's opening, a sample every interval, its close."""
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
            self._take_buffer()
        except Exception as err:
            self.reading.notes.append(f"{self.source.kind}: {type(err).__name__}: {err}")
        finally:
            self._done.set()
