"""What a telemetry window holds: the order of its end reads, the driver samples kept inside it,
and which source a hung read takes out of the process.

A source here records each read it is asked for and keeps planted driver samples, so the
sampler's ordering and clipping are checked against the window's own two ends.
"""

from __future__ import annotations

import gc
import threading
import time
from functools import partial

import pytest

from lcab.bench import telemetry
from lcab.bench.pass_telemetry import LengthTelemetry
from lcab.bench.telemetry import Sampler
from lcab.bench.telemetry_sources import Sample, WindowBuffer
from lcab.bench.timing import repeat


class Recorder:
    """A source that logs its reads in order and returns ``planted`` as its driver buffer."""

    kind = "recorder"
    energy_step_s = 0.1

    def __init__(self, reads_block: bool = True) -> None:
        self.reads_block = reads_block
        self.log: list[str] = []
        self.planted: list[Sample] = []

    def open(self) -> None:
        self.log.append("open")

    def device_name(self) -> str | None:
        self.log.append("name")
        return "recorder"

    def energy_j(self) -> float | None:
        self.log.append("energy")
        return float(len(self.log))

    def energy_note(self) -> str | None:
        return None

    def power_limit_w(self) -> float | None:
        self.log.append("limit")
        return None

    def sample(self, t_s: float) -> Sample:
        self.log.append("sample")
        return Sample(t_s, 1000.0, None, None, None)

    def event_names(self, bits: int) -> list[str]:
        return []

    def mark(self) -> object:
        self.log.append("mark")
        return None

    def since(self, mark: object) -> WindowBuffer:
        self.log.append("since")
        return WindowBuffer(samples=list(self.planted))


@pytest.mark.parametrize("reads_block", [True, False])
def test_the_energy_counter_is_read_last_at_the_opening_and_first_at_the_close(
    reads_block: bool,
) -> None:
    source = Recorder(reads_block)
    with Sampler(source):
        opened = list(source.log)
    closed = source.log[len(opened) :]
    assert opened[-1] == "energy" and opened.count("energy") == 1
    assert closed[0] == "energy" and closed.count("energy") == 1
    assert {"sample", "mark", "limit"} <= set(opened) and {"sample", "since"} <= set(closed)


def test_driver_samples_stamped_outside_the_window_are_left_out() -> None:
    """The buffer is read after the closing reads: a sample stamped then is not the window's,
    nor is one from before it opened; the end reads are not inside it either."""
    source = Recorder()
    with Sampler(source) as sampler:
        now = time.time()
        source.planted = [
            Sample(now - 10.0, 500.0, None, None, None),  # before the window
            Sample(now, 1500.0, None, None, None),  # inside it
            Sample(time.time() + 10.0, 2500.0, None, None, None),  # stamped after its close
        ]
    reading = sampler.reading
    assert reading.inside() == [1500.0]
    assert reading.clocks() == (1500.0, 1500.0, 1500.0)  # not the ends' 1000, nor 500 or 2500
    assert sorted(s.clock_mhz for s in reading.samples) == [1000.0, 1000.0, 1500.0]
    ends = [s.t_s for s in reading.samples if s.clock_mhz == 1000.0]
    assert reading.window_s is not None and ends[0] < 0 and ends[1] > reading.window_s


def test_without_a_sample_inside_the_clock_is_the_ends_and_says_so() -> None:
    source = Recorder()
    with Sampler(source) as sampler:
        pass
    assert sampler.reading.inside() == []
    assert sampler.reading.clocks() == (1000.0, 1000.0, 1000.0)


def test_a_hung_source_is_abandoned_and_forgotten_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python gives a freed object's address (its ``id``) to the next one it makes, so what is
    remembered of an abandoned source must go with it: a new source is never taken for it."""
    monkeypatch.setattr(telemetry, "WAIT_S", 0.05)
    release = threading.Event()

    class Hangs(Recorder):
        def open(self) -> None:
            release.wait(10)

    remembered = len(telemetry._ABANDONED)
    source = Hangs()
    with Sampler(source) as first:
        pass
    with Sampler(source) as second:
        pass
    assert any("did not open within" in n for n in first.reading.notes)
    assert any("earlier in this process" in n for n in second.reading.notes)
    assert len(telemetry._ABANDONED) == remembered + 1
    release.set()  # the hung read returns: nothing holds the source any more
    for thread in threading.enumerate():
        if thread.name == "lcab-telemetry-end":
            thread.join(5)
    del source, first, second
    gc.collect()
    assert len(telemetry._ABANDONED) == remembered  # nothing left for a reused address to match
    with Sampler(Hangs()) as fresh:
        pass
    assert fresh.reading.device_name == "recorder" and not fresh.reading.notes


def test_the_energy_window_holds_its_calls_back_to_back_and_nothing_else() -> None:
    """Its calls are the pass and its before-each hook alone (no L2 flush, no barrier), inside
    the window's two ends, until the window spans the counter's 10 steps and a quarter."""
    source = Recorder(reads_block=False)
    source.energy_step_s = 0.002  # 10 steps and a quarter: 25 ms of 1 ms calls
    telemetry_ = LengthTelemetry(source, None, None, shared_counter=True)
    with Sampler(source) as timed:
        pass
    ran: list[tuple[str, float]] = []

    def call() -> None:
        ran.append(("call", time.time()))
        time.sleep(0.001)

    def before_each() -> None:
        ran.append(("before", time.time()))

    window = telemetry_.energy_window(
        timed, 4.0, partial(repeat, call, before_each=before_each, device="cpu"), None
    )
    assert window is not None and window.reading.window_s is not None
    calls = window.reading.calls
    assert calls is not None and [k for k, _ in ran] == ["before", "call"] * calls
    # counted at the timed median's 4 ms a call, then topped up at the window's own rate
    assert window.reading.window_s >= 0.025 and calls > 25 / 4
    opened, closed = window._t  # the wall clock at the window's two ends
    assert all(opened < t < closed for _, t in ran)
