"""A rank SIGKILLed by someone (a user, a scheduler) is an ``error`` naming the signal, not ``oom``.

Only the out-of-memory killer's count in the memory cgroup makes a SIGKILL an ``oom``
(`lcab.bench.job_memory.oom_kills`); ``tests/app/test_frontier.py`` makes a cgroup whose killer
does it for real. Here the test itself kills the rank while it times a length.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from lcab.bench.supervisor import run_supervised
from lcab.cell import JobInfo
from lcab.config import resolve_cell

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def _grandchildren() -> list[int]:
    """Live processes whose parent is a child of this one: the ranks the forkserver started."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            parents[int(stat.parent.name)] = int(parent)
    children = {pid for pid, parent in parents.items() if parent == os.getpid()}
    return [pid for pid, parent in parents.items() if parent in children]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_rank_killed_by_hand_is_an_error_with_the_signal(compose, tmp_path: Path) -> None:
    long = ["seqlen.values=[16384]", "bench.reps=100000", "bench.check_numerics=false"]
    cfg = compose(["kernel=ranges", "mask=causal", *long, "bench.progress=false"])
    cell = resolve_cell(cfg, JobInfo(output_dir=str(tmp_path)))
    killed: list[int] = []

    def kill_the_rank() -> None:  # as soon as it runs, well before its 100,000 repetitions end
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            for rank in _grandchildren():  # a world of one
                os.kill(rank, signal.SIGKILL)
                killed.append(rank)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_rank)
    killer.start()
    (record,) = run_supervised(cell, lambda record: None)
    killer.join()
    assert len(killed) == 1 and record.status == "error"
    assert "SIGKILL" in record.reasons[0] and "no out-of-memory kill" in record.reasons[0]
