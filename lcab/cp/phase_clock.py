"""The clock of a CP call's phases (compute, comm, wait): the host's on CPU, the GPU's on CUDA.

On a GPU, ``perf_counter`` measures the host launching kernels, and NCCL's ``work.wait()``
returns at once (it only makes the stream wait). So while one call is described (`phase_clock`),
each phase records a pair of CUDA events on the stream that runs it, all read after one
synchronize at the end: a sync inside a phase would serialise the overlap being measured.
Outside `phase_clock` phases keep the host clock (timed repetitions never pay for events).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


class PhaseClock(Protocol):
    """Marks the start and end of phases and adds their durations up."""

    def start(self) -> Any:
        """A mark taken as a phase starts."""

    def stop(self, name: str, mark: Any, into: MutableMapping[str, float]) -> None:
        """End the phase begun at ``mark``; add its seconds to ``into[name]`` (now or later)."""

    def settle(self) -> None:
        """Add every pending duration (the one synchronize of a GPU clock)."""


class HostClock:
    """``perf_counter``: the CPU's clock, added at once."""

    def start(self) -> float:
        """Host time now."""
        return time.perf_counter()

    def stop(self, name: str, mark: Any, into: MutableMapping[str, float]) -> None:
        """Add the host time since ``mark``."""
        into[name] += time.perf_counter() - float(mark)

    def settle(self) -> None:
        """Nothing is pending."""
        return None


class EventClock:
    """CUDA events on the current stream, read after one synchronize (`settle`).

    ``event`` and ``synchronize`` are seams: CUDA's by default.
    """

    def __init__(
        self,
        device: torch.device,
        event: Callable[[], Any] | None = None,
        synchronize: Callable[[], None] | None = None,
    ) -> None:
        self.device = device
        self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self._synchronize = synchronize or (lambda: torch.cuda.synchronize(device))
        self._pending: list[tuple[str, Any, Any, MutableMapping[str, float]]] = []

    def start(self) -> Any:
        """An event recorded on the current stream."""
        mark = self._event()
        mark.record()
        return mark

    def stop(self, name: str, mark: Any, into: MutableMapping[str, float]) -> None:
        """Record the end event; the duration is read in `settle`."""
        end = self._event()
        end.record()
        self._pending.append((name, mark, end, into))

    def settle(self) -> None:
        """One synchronize, then every phase's GPU milliseconds added as seconds."""
        if not self._pending:
            return
        self._synchronize()
        pending, self._pending = self._pending, []
        for name, begin, end, into in pending:
            into[name] += float(begin.elapsed_time(end)) / 1e3


_HOST = HostClock()
_CLOCK: PhaseClock = _HOST
_TRACE_PHASES = False
"""Whether `timed_phase` also opens a profiler range (only while a trace records: a range costs
a dispatcher call, which timed repetitions should not pay)."""


@contextmanager
def traced_phases() -> Iterator[None]:
    """Make every phase a ``torch.profiler.record_function`` range ``lcab.cp.<name>``."""
    global _TRACE_PHASES
    before, _TRACE_PHASES = _TRACE_PHASES, True
    try:
        yield
    finally:
        _TRACE_PHASES = before


@contextmanager
def phase_clock(device: torch.device, clock: PhaseClock | None = None) -> Iterator[PhaseClock]:
    """Time phases on ``device``'s clock inside the block; settled when it ends.

    CUDA gets an `EventClock`, anything else the host clock (``clock`` overrides: a seam).
    """
    global _CLOCK
    chosen = clock or (EventClock(device) if device.type == "cuda" else _HOST)
    before, _CLOCK = _CLOCK, chosen
    try:
        yield chosen
    finally:
        _CLOCK = before
        chosen.settle()


class timed_phase:  # noqa: N801  (used as a function: ``with timed_phase(...)``)
    """Add the duration of the block to ``into[name]`` on the current phase clock.

    A class, not a generator: a ring enters a phase several times per step, and a 96-rank
    schedule check (`lcab.cp.schedule_check`) runs 100,000 of them.
    """

    __slots__ = ("clock", "into", "mark", "name", "trace")

    def __init__(self, name: str, into: MutableMapping[str, float]) -> None:
        self.name, self.into = name, into

    def __enter__(self) -> None:
        self.clock = _CLOCK
        self.trace = (
            torch.profiler.record_function(f"lcab.cp.{self.name}") if _TRACE_PHASES else None
        )
        self.mark = self.clock.start()
        if self.trace is not None:
            self.trace.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.trace is not None:
                self.trace.__exit__(*exc)
        finally:
            self.clock.stop(self.name, self.mark, self.into)
