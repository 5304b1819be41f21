"""What a run says in a pipe (a SLURM log, ``| tee``), as a newcomer met it.

The real CLI in subprocesses, stdout a pipe: a line per length while the cell runs, then the
table within 120 columns with every row whole and every reason in its notes; a cell its
strategy cannot lay out recorded ``skipped`` without a rank process started (a 96-rank Ulysses
cell on 8 heads started 96 processes for 52 s to say so); Ctrl-C one line saying what was
saved, where, and the command that continues (it was a 60-line traceback).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from lcab.records.sinks import read_records
from tests.helpers.cli import cli_env, read_jsonl, run_lcab
from tests.helpers.table_text import expected_keys, printed_rows, row_keys

pytestmark = pytest.mark.slow

FLEX_BWD = "bwd: PyTorch's FlexAttention has no backward on CPU"

COUNT_STARTS = """
import multiprocessing.process
import os

_start = multiprocessing.process.BaseProcess.start


def start(self):
    with open(os.environ["LCAB_TEST_STARTS"], "a") as out:
        out.write(self.name + "\\n")
    return _start(self)


multiprocessing.process.BaseProcess.start = start
"""
"""A ``sitecustomize`` that writes a line for every process multiprocessing starts (ranks)."""


def test_one_cell_in_a_pipe_prints_a_line_per_length_then_a_table_that_fits(tmp_path):
    run = tmp_path / "run"
    args = ("kernel=flex", "mask=causal", "seqlen.values=[256,512]", "bench=quick")
    done = run_lcab(*args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    progress = [line for line in lines if line.startswith("lcab: flex/none/causal [")]
    assert [line.split(" seqlen ")[1].split(":")[0] for line in progress] == ["256", "512"]
    assert lines.index(progress[-1]) < min(i for i, line in enumerate(lines) if "─" in line)
    assert "" not in lines[: lines.index(progress[-1])]  # no progress bar's blank lines
    records = read_records(run / "records.jsonl")
    table = done.stdout[done.stdout.index(progress[-1]) + len(progress[-1]) :]
    assert max(len(line) for line in table.splitlines()) <= 120
    assert row_keys(printed_rows(table)) == expected_keys(records)
    notes = " ".join(table.split())  # the notes, whatever their line breaks
    for record in records:
        assert FLEX_BWD in record.reasons
        for reason in record.reasons:
            assert f"] {reason}" in notes  # every reason, not only the first


@pytest.mark.dist
def test_a_cell_its_strategy_cannot_lay_out_starts_no_rank(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNT_STARTS)
    starts = tmp_path / "starts.txt"
    env = cli_env(LCAB_TEST_STARTS=str(starts))
    env["PYTHONPATH"] = f"{hook}{os.pathsep}{env['PYTHONPATH']}"
    common = ("seqlen.values=[256]", "bench=quick", "cp=ulysses")

    refused = run_lcab(*common, "topology=12x8", f"hydra.run.dir={tmp_path / 'r'}", env=env)
    assert refused.returncode == 0, refused.stderr[-3000:]
    (record,) = read_jsonl(tmp_path / "r" / "records.jsonl")
    why = "heads_q=8 is not divisible by the Ulysses degree 96"  # 8 heads (CPU problem), 96 ranks
    assert record["status"] == "skipped" and record["world_size"] == 96
    assert record["reasons"] == [f"fwd: {why}", f"bwd: {why}"]
    assert not starts.exists()  # no rank process was started

    ran = run_lcab(*common, "topology=local2", f"hydra.run.dir={tmp_path / 'ok'}", env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (record,) = read_jsonl(tmp_path / "ok" / "records.jsonl")
    assert record["status"] == "ok"
    assert len(starts.read_text().splitlines()) == 2  # the hook sees the ranks it would count


def test_ctrl_c_says_in_one_line_what_was_saved_where_and_how_to_go_on(tmp_path):
    run = tmp_path / "run"
    args = ["kernel=naive", "mask=causal", "seqlen.values=[256,16384]", "bench=quick"]
    argv = [sys.executable, "-m", "lcab.main", *args, f"hydra.run.dir={run}"]
    process = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ctrl-C reaches the whole process group, ranks too
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    records = run / "records.jsonl"
    deadline = time.monotonic() + 300
    while not (records.exists() and records.read_text().count("\n") == 1):
        assert process.poll() is None and time.monotonic() < deadline, "no first record"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)  # during the second length (16K on the naive kernel)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    (line,) = err.splitlines()
    said, _, command = line.partition("; continue with: ")
    assert said == f"lcab: interrupted; 1 record(s) saved in {records}"
    go_on = ["python", "-m", "lcab.main", *args, "resume=true", f"hydra.run.dir={run}"]
    assert shlex.split(command) == go_on
    assert len(read_records(records)) == 1
