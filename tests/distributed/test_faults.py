"""A rank that raises, dies or hangs ends its world with an error or timeout, never a hang."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]


def ring_with_a_fault(rank: int, world: int, rendezvous: str, messages, fault: str) -> None:
    """A ring attention call where rank 1 fails mid-ring (between two transfers)."""
    import torch

    from lcab.cp import STRATEGIES, comm
    from lcab.distributed.context import DistContext
    from lcab.kernels import Problem, get_kernel
    from lcab.masks import make_mask

    ctx = DistContext.start_local(rank, world, 2, "gloo", rendezvous, 300)
    if rank == 1:
        calls = {"n": 0}
        original = comm.exchange

        def faulty(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:  # the second transfer of the ring
                if fault == "raise":
                    raise RuntimeError("injected failure mid-ring")
                if fault == "die":
                    os._exit(3)
                time.sleep(3600)  # "hang"
            return original(*args, **kwargs)

        comm.exchange = faulty
        import lcab.cp.ring_attention as rings

        rings.exchange = faulty
    mask = make_mask("causal", 64)
    problem = Problem(64, 64, 4, 2, 8, torch.float64)
    strategy = STRATEGIES.get("ring")({"balance": "zigzag"}, 2)
    plan = strategy.plan(mask, problem, world)
    prepared = strategy.build(plan, mask, problem, get_kernel("ranges"), ctx)
    x = [prepared.to_native(torch.randn(64, h, 8, dtype=torch.float64)) for h in (4, 2, 2)]
    messages.put(("progress", rank))
    prepared.run(*x)
    ctx.close()


@pytest.mark.parametrize(
    ("fault", "status", "words"),
    [
        ("raise", "error", "injected failure mid-ring"),
        ("die", "error", "exited with code 3"),
        ("hang", "timeout", "no progress"),
    ],
)
def test_a_failing_rank_ends_the_world_quickly_and_cleanly(tmp_path, fault, status, words):
    start = time.monotonic()
    result = launch(ring_with_a_fault, 4, (fault,), 20.0, lambda msg: None, tmp_path)
    elapsed = time.monotonic() - start
    assert result.status == status
    assert words in result.reason or words in result.detail
    assert elapsed < 60, f"took {elapsed:.0f} s"
    # every rank process is gone: the peers blocked in the ring were killed, none left behind
    assert all(code is not None for code in result.exit_codes)
    assert not multiprocessing.active_children()


def healthy(rank: int, world: int, rendezvous: str, messages) -> None:
    from lcab.distributed.context import DistContext

    ctx = DistContext.start_local(rank, world, 2, "gloo", rendezvous, 60)
    ctx.barrier()
    messages.put(("hello", rank))
    ctx.close()


def test_a_healthy_world_finishes_and_reports(tmp_path):
    seen = []
    result = launch(healthy, 3, (), 60.0, lambda msg: seen.append(msg[1]), tmp_path)
    assert result.status == "done" and sorted(seen) == [0, 1, 2]
    assert result.exit_codes == (0, 0, 0)


def report_pid_and_sleep(rank: int, world: int, rendezvous: str, messages) -> None:
    messages.put(("pid", os.getpid()))
    time.sleep(600)


LAUNCHER = """
import sys
from lcab.distributed.launch import launch
from tests.distributed.test_faults import report_pid_and_sleep
launch(report_pid_and_sleep, 2, (), 600.0, lambda msg: print(msg[1], flush=True), sys.argv[1])
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an exited process not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_exit_when_the_launching_process_is_killed(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    pids: list[int] = []
    with subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            pids = [int(proc.stdout.readline()) for _ in range(2)]
            assert all(_running(pid) for pid in pids)
            os.kill(proc.pid, signal.SIGKILL)  # no clean-up can run in the launcher
            proc.wait(timeout=30)
            deadline = time.monotonic() + 20
            while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [pid for pid in pids if _running(pid)], "ranks outlived their launcher"
        finally:
            proc.kill()
            for pid in pids:
                if _running(pid):
                    os.kill(pid, signal.SIGKILL)
