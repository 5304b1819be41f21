"""A multi-node CP rank notes the scheduler's SIGTERM like a one-task job does.

The scheduler sends SIGTERM to every task of a job it ends (scancel, time limit); submitit's
handler lets the tasks run on until the SIGKILL that follows, which reaches the nodes one by
one. A rank whose peer is killed first then fails in its next collective: its failure must
name the scheduler's stop, not the lost peer it ran into. Here two real rank processes
(``run_as_rank``, gloo, joined from the environment as a scheduler's tasks are) get a real
SIGTERM while they measure, rank 1 is then killed, and rank 0's failure file is read. Without
the SIGTERM the same kill is a plain failure (the note comes from the signal).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lcab.cell import JobInfo
from tests.helpers.cli import cli_env

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

_RANK = """
import pickle, signal, sys
signal.signal(signal.SIGTERM, lambda signum, frame: None)  # submitit's bypass: run on
from lcab.bench.scheduled import run_as_rank, scheduled_rank, watch_scheduler_signals
watch_scheduler_signals()  # as ShapedSlurmLauncher.__call__ does in every task
with open(sys.argv[1], "rb") as f:
    cell = pickle.load(f)
rank, world = scheduled_rank()
records = open(sys.argv[2], "a")
def emit(record):
    records.write(record.to_json() if hasattr(record, "to_json") else str(record.seqlen))
    records.write("\\n")
    records.flush()
run_as_rank(cell, emit, rank, world)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_ranks(cell: Any, folder: Path) -> list[subprocess.Popen[bytes]]:
    cell_file = folder / "cell.pkl"
    cell_file.write_bytes(pickle.dumps(cell))
    env = {k: v for k, v in cli_env().items() if not k.startswith("SLURM_")}
    env.update(
        LCAB_RANKS_FROM_SCHEDULER="test",
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )
    return [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(cell_file), str(folder / "emitted.txt")],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for rank in range(2)
    ]


def _wait_for(predicate: Any, timeout_s: float, what: str, folder: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            logs = {p.name: p.read_text()[-1500:] for p in folder.glob("rank-*.log")}
            raise AssertionError(f"{what} within {timeout_s:g} s; logs: {logs}")
        time.sleep(0.1)


@pytest.mark.parametrize("sigterm", [True, False])
def test_a_rank_failing_after_the_scheduler_s_sigterm_names_the_scheduler(
    compose, tmp_path, sigterm
):
    from lcab.config import resolve_cell

    cfg = compose(
        [
            "kernel=ranges",
            "cp=ring",
            "topology=local2",
            "mask=causal",
            "seqlen.values=[256,65536]",  # the second length runs for seconds per call
            "bench=quick",
            "bench.passes=[fwd]",
            "bench.check_numerics=false",
            "bench.memory=false",
            "bench.timeout_s=120",
            "problem.device=cpu",
            "problem.heads_q=2",
            "problem.heads_kv=1",
            "problem.head_dim=16",
        ]
    )
    cell_dir = tmp_path / "cell"
    cell = resolve_cell(cfg, JobInfo(output_dir=str(cell_dir), run_id="t-0"))
    procs = _start_ranks(cell, tmp_path)
    try:
        emitted = tmp_path / "emitted.txt"
        # rank 0 emitted the first length: both ranks are past the rendezvous, measuring
        _wait_for(lambda: emitted.exists() and emitted.read_text(), 120, "no record", cell_dir)
        time.sleep(0.5)
        if sigterm:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            for rank, proc in enumerate(procs):
                if proc.poll() is not None:  # a blocking gloo call interrupted by the signal
                    # may fail at once; the rank must then say the signal came first
                    noted = json.loads((cell_dir / f"rank-{rank}.failure.json").read_text())
                    assert noted["stopped_by_scheduler"] is True, noted
                    assert proc.returncode not in (-signal.SIGTERM, 128 + signal.SIGTERM)
        procs[1].kill()  # the scheduler's SIGKILL reaches rank 1's node first
        procs[0].wait(timeout=90)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert procs[0].returncode == 1
    failure = json.loads((cell_dir / "rank-0.failure.json").read_text())
    assert failure["rank"] == 0 and failure["seqlen"] == 65536
    if sigterm:
        assert failure["stopped_by_scheduler"] is True
        assert failure["error"].startswith("SIGTERM reached this rank (the scheduler, or srun")
    else:
        assert failure.get("stopped_by_scheduler", False) is False
        assert "SIGTERM" not in failure["error"]
    assert os.path.exists(cell_dir / "rank-0.log")
