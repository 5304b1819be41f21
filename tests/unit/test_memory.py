"""Peak memory: a 200 MB allocation is seen, even freed inside the region, nothing beside it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from lcab.bench import memory
from lcab.bench.memory import MemoryReading, PeakMemory, _maxrss_bytes
from tests.helpers.run_if import run_if

CPU = torch.device("cpu")
MB = 1_000_000


def test_held_allocation_raises_peak() -> None:
    with PeakMemory(CPU) as peak:
        x = torch.ones(50_000_000)  # 200 MB, every page written
    assert peak.reading.kind == "cpu_hwm"
    assert peak.reading.delta_bytes >= 150 * MB
    assert peak.reading.peak_bytes - peak.reading.baseline_bytes == peak.reading.delta_bytes
    del x


def test_a_peak_freed_inside_the_region_is_seen_with_no_thread_beside_it() -> None:
    """The kernel keeps the high-water mark: a tensor gone before the region ends still counts,
    and nothing runs beside the measured code (a sampling thread slowed it)."""
    alive = threading.active_count()
    with PeakMemory(CPU) as peak:
        inside = threading.active_count()
        x = torch.ones(50_000_000)
        del x
    assert inside == alive
    assert peak.reading.delta_bytes >= 150 * MB


def test_idle_region_delta_small() -> None:
    with PeakMemory(CPU) as peak:
        time.sleep(0.02)
    assert 0 <= peak.reading.delta_bytes < 16 * MB


def test_a_region_that_raises_still_reads() -> None:
    meter = PeakMemory(CPU)
    with pytest.raises(KeyError), meter:
        raise KeyError("boom")
    assert meter.reading.kind == "cpu_hwm"


def test_repeated_use_starts_each_region_from_its_own_baseline() -> None:
    meter = PeakMemory(CPU)
    readings: list[MemoryReading] = []
    for size in (0, 25_000_000, 0):
        with meter:
            x = torch.ones(size)
        readings.append(meter.reading)
        del x
    assert len({id(r) for r in readings}) == 3
    assert readings[1].delta_bytes >= 75 * MB
    assert readings[2].delta_bytes < 16 * MB  # the 100 MB of the region before is not its peak


def test_reading_before_exit_and_bad_args() -> None:
    meter = PeakMemory(CPU)
    with pytest.raises(RuntimeError):
        _ = meter.reading
    with meter, pytest.raises(RuntimeError):
        meter.__enter__()
    with pytest.raises(ValueError):
        PeakMemory(torch.device("meta"))


def test_without_a_resettable_mark_the_lifetime_peak_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(memory, "PROC_SELF", tmp_path / "absent")
    with PeakMemory(CPU) as peak:
        pass
    assert peak.reading.kind == "cpu_maxrss"
    assert peak.reading.peak_bytes == _maxrss_bytes() >= peak.reading.baseline_bytes


@pytest.mark.gpu
@run_if(cuda=True)
def test_cuda_peak_counts_allocation() -> None:
    device = torch.device("cuda")
    with PeakMemory(device) as peak:
        x = torch.ones(50_000_000, device=device)
        del x
    assert peak.reading.kind == "cuda_max_allocated"
    assert peak.reading.delta_bytes >= 200_000_000


MIB = 2**20


class _FakeAllocator:
    """PyTorch's caching allocator reduced to its counters (no GPU here: they are the seam).

    Freed blocks stay reserved (cached); an allocation reuses the cache before it reserves
    more; the peak counters restart from the current values on ``reset_peak_memory_stats``.
    """

    def __init__(self, monkeypatch) -> None:
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        for name in ("reset_peak_memory_stats", "memory_allocated", "memory_reserved"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: self.peak_allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: self.peak_reserved)

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes  # the block stays reserved

    def reset_peak_memory_stats(self, device) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def memory_allocated(self, device) -> int:
        return self.allocated

    def memory_reserved(self, device) -> int:
        return self.reserved


def test_cuda_reading_leaves_out_the_flush_buffer_and_the_earlier_cache(monkeypatch) -> None:
    gpu = _FakeAllocator(monkeypatch)
    gpu.alloc(44 * MIB)  # the inputs
    gpu.alloc(400 * MIB)  # an earlier pass's work, freed but cached
    gpu.free(400 * MIB)
    gpu.alloc(256 * MIB)  # the L2-flush buffer, made before the region (from the cache)
    with PeakMemory(torch.device("cuda", 0), exclude_bytes=256 * MIB) as memory:
        gpu.alloc(200 * MIB)  # the kernel: 144 MiB still cached, then 56 MiB more reserved
        gpu.alloc(100 * MIB)  # then 100 MiB more, all newly reserved
        gpu.free(300 * MIB)
    reading = memory.reading
    assert reading.baseline_bytes == 44 * MIB  # the flush buffer is not the kernel's
    assert reading.peak_bytes == 344 * MIB and reading.delta_bytes == 300 * MIB
    # reserved on enter: 44 + 400 (cache) = 444; at the peak 44 + 256 + 300 = 600
    assert reading.reserved_bytes == 156 * MIB and reading.kind == "cuda_max_allocated"


def test_summary_reports_the_largest_peak_with_its_rank_and_the_largest_reserved() -> None:
    from lcab.bench.results import SampleMeasure, summarise
    from lcab.bench.timing import Timing
    from lcab.records.schema import PassResult

    def sample(peak: int, rank: int, reserved: int | None) -> SampleMeasure:
        reading = MemoryReading(peak * MIB, 10 * MIB, "cuda_max_allocated", reserved, rank)
        timing = Timing((1.0, 2.0), {0.5: 1.5}, 0, "cuda_event")
        return SampleMeasure(timing, [1.5, 1.5], 100, 200, reading)

    result = PassResult()
    summarise(result, [sample(300, 3, 500 * MIB), sample(700, 5, 400 * MIB)], world=8)
    assert result.mem_peak_mib == 700 and result.mem_peak_rank == 5
    assert result.mem_delta_mib == 690 and result.mem_reserved_mib == 500
    cpu = PassResult()
    summarise(cpu, [sample(300, None, None)], world=1)  # type: ignore[arg-type]
    assert cpu.mem_reserved_mib is None and cpu.mem_peak_rank is None


def test_every_record_names_torch_and_nccl(monkeypatch) -> None:
    from lcab.bench.environment import environment, nccl_version

    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    assert nccl_version() == "2.21.5"
    env = environment("cpu")
    assert env["nccl_version"] == "2.21.5" and env["torch_version"] == torch.__version__

    def cpu_build() -> None:
        raise AttributeError("module 'torch._C' has no attribute '_nccl_version'")

    monkeypatch.setattr(torch.cuda.nccl, "version", cpu_build)
    assert environment("cpu")["nccl_version"] is None
