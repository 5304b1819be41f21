"""CP phases on the device's clock: CUDA events on the running stream, read after one sync.

No GPU here, so CUDA's events are replaced through `EventClock`'s seams by a stream whose
clock only the "kernels" advance (as a GPU's does while the host has long returned), and
``synchronize`` is counted. What real events measure on a real stream needs the ``gpu`` tier.
"""

from __future__ import annotations

import time

import pytest
import torch

from lcab.cp.comm import STATS, phase
from lcab.cp.phase_clock import EventClock, HostClock, phase_clock


class FakeStream:
    """A stream's clock (ms): advanced by enqueued work, never by the host."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.syncs = 0
        self.recorded = 0

    def kernel(self, ms: float) -> None:
        self.now_ms += ms  # the host returns at once; the stream is busy for ``ms``

    def event(self) -> FakeEvent:
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.syncs += 1


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        self.stream, self.at_ms = stream, None

    def record(self) -> None:
        self.stream.recorded += 1
        self.at_ms = self.stream.now_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.stream.syncs, "elapsed_time before a synchronize"
        return end.at_ms - self.at_ms


@pytest.fixture
def stream():
    STATS.reset()
    yield FakeStream()
    STATS.reset()


def test_phases_take_the_stream_clock_and_synchronize_once_at_the_end(stream):
    clock = EventClock(torch.device("cuda", 0), stream.event, stream.synchronize)
    host_start = time.perf_counter()
    with phase_clock(torch.device("cuda", 0), clock):
        with phase("total"):
            with phase("compute"):
                stream.kernel(7.0)
            with phase("wait"):  # the stream waits on NCCL's: 3 ms of its clock
                stream.kernel(3.0)
            with phase("compute"):
                stream.kernel(2.0)
        assert stream.syncs == 0  # nothing synchronizes inside the phases
        assert "compute" not in STATS.seconds  # durations are read only when settled
    host_s = time.perf_counter() - host_start
    assert stream.syncs == 1
    assert stream.recorded == 2 * 4
    assert STATS.seconds["compute"] == pytest.approx(9e-3)
    assert STATS.seconds["wait"] == pytest.approx(3e-3)
    assert STATS.seconds["total"] == pytest.approx(12e-3)
    assert host_s < 12e-3  # the host never spent the GPU's time: the host clock would miss it


def test_a_clock_with_nothing_recorded_does_not_synchronize(stream):
    clock = EventClock(torch.device("cuda", 0), stream.event, stream.synchronize)
    with phase_clock(torch.device("cuda", 0), clock):
        pass
    assert stream.syncs == 0


def test_cpu_keeps_the_host_clock_inside_and_outside_a_described_call(stream):
    with phase_clock(torch.device("cpu")) as clock:
        assert isinstance(clock, HostClock)
        with phase("compute"):
            time.sleep(0.02)
    with phase("comm"):  # outside: the host clock too (timed repetitions pay no events)
        time.sleep(0.01)
    assert STATS.seconds["compute"] >= 0.02 and STATS.seconds["comm"] >= 0.01


def test_cuda_device_gets_an_event_clock_by_default_and_cpu_the_host_one():
    # no phase inside: nothing is recorded, so this runs without a GPU too
    with phase_clock(torch.device("cuda", 0)) as clock:
        assert isinstance(clock, EventClock) and clock.device == torch.device("cuda", 0)
    with phase_clock(torch.device("cpu")) as clock:
        assert isinstance(clock, HostClock)
