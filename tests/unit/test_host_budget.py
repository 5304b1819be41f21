"""A rank under a CPU memory budget: freed tensors leave its data segment; a NULL from malloc
said as a SystemError is an out-of-memory there, and a bug elsewhere.

Each case runs in a fresh interpreter: ``RLIMIT_DATA`` and glibc's malloc settings are the
process's own and cannot be undone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lcab.bench.results import NULL_WITHOUT_ERROR, is_oom
from lcab.bench.supervisor import _status
from lcab.distributed.launch import LaunchResult

GROWTH = textwrap.dedent(
    """
    import sys, torch
    from lcab.bench import worker
    from lcab.cell import BenchConfig

    def data_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmData:"):
                return int(line.split()[1]) / 1024

    if sys.argv[1] == "budget":
        class Cell:  # the fields apply_memory_budget reads
            device = "cpu"
            bench = BenchConfig(memory_budget_gib=4.0)
        worker.apply_memory_budget(Cell())
    # glibc raises its mmap threshold to the largest block freed (32 MiB here): a 24 MiB
    # block after it comes from the heap, whose top stays mapped once it is freed
    big = torch.ones(8 << 20)
    del big
    before = data_mib()
    for _ in range(3):
        block = torch.ones(6 << 20)
        del block
    print(data_mib() - before)
    """
)


def _growth(mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", GROWTH, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc: Linux")
def test_freed_tensors_leave_the_data_segment_of_a_budgeted_rank() -> None:
    plain, budgeted = _growth("plain"), _growth("budget")
    assert plain >= 20.0  # glibc as it comes: the 24 MiB block stays in the heap
    assert budgeted <= 2.0  # the threshold held at 128 KiB: each block unmapped on free


ISOLATED = textwrap.dedent(
    """
    import resource, sys
    from lcab.bench.results import NULL_WITHOUT_ERROR, is_oom
    if sys.argv[1] == "limited":
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (64 << 30, hard))
    print(is_oom(SystemError(NULL_WITHOUT_ERROR)), is_oom(SystemError("other")))
    """
)


def test_a_null_without_error_is_oom_only_under_a_data_limit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ISOLATED, "limited"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True False"
    assert not is_oom(SystemError(NULL_WITHOUT_ERROR))  # this test process has no data limit


def test_a_world_whose_rank_said_so_is_oom_only_under_a_host_budget() -> None:
    said = f"rank 1 raised SystemError: {NULL_WITHOUT_ERROR}"
    result = LaunchResult(status="error", reason=said)
    assert _status(result, host_budget=True, oom_killed=False) == "oom"
    assert _status(result, host_budget=False, oom_killed=False) == "error"
