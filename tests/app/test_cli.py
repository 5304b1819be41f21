"""The real command line, in subprocesses: a small multirun, bad input, a distributed cell.

These are the commands users type (`python -m lcab.main ...`); the assertions read the
records the runs wrote, so they check what a user would find on disk.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import read_jsonl, run_lcab

pytestmark = pytest.mark.slow


def lcab_main(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_lcab(*args, cwd=cwd)


def test_multirun_writes_one_merged_record_per_cell_and_seqlen(tmp_path):
    sweep = tmp_path / "sweep"
    done = lcab_main(
        "-m",
        "kernel=naive,sdpa",
        "mask=causal,document",
        "seqlen=tiny",
        "bench=quick",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(sweep / "records.jsonl")
    seqlens = [256, 512]  # conf/seqlen/tiny.yaml
    expected = {
        (k, m, s) for k in ("naive", "sdpa") for m in ("causal", "causal_document") for s in seqlens
    }
    got = {(r["kernel"], r["mask"], r["seqlen"]) for r in records}
    assert got == expected and len(records) == len(expected)
    assert all(r["status"] == "ok" for r in records), [r["reasons"] for r in records]
    # numerics were checked against the fp64 reference, within the recorded tolerance
    for r in records:
        for p in r["passes"]:
            assert r[p]["max_abs_err"] is not None
            assert r[p]["max_abs_err"] <= r["numerics_tolerance"]
    # the CSV at the sweep root has the same rows
    with open(sweep / "records.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["kernel"], r["mask"], int(r["seqlen"])) for r in rows} == expected
    # each job also kept its own records file, and its log says what it did
    assert len(list(sweep.glob("*/records.jsonl"))) == 4
    for log in sweep.glob("*/main.log"):
        lines = log.read_text().splitlines()
        assert lines[0].split(" - ", 1)[1].startswith("cell kernel=")
        assert [line.split(" - ", 1)[1].split(":")[0] for line in lines[1:]] == [
            "seqlen 256", "seqlen 512"
        ]  # fmt: skip
    assert len(list(sweep.glob("*/main.log"))) == 4
    # the sweep ends with one table of every cell, and no cell name carries debug=...
    assert "sweep " in done.stdout and "4 cells, 8 records" in done.stdout


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("kernel=fa9", ["kernel", "fa9", "ranges"]),
        ("mask=diagonal", ["mask", "diagonal", "causal_document"]),
        ("seqlen=huge", ["seqlen", "huge", "short"]),
        ("bench.repz=3", ["repz"]),
        ("problem.heads_q=7", ["heads_q", "7", "heads_kv"]),
        ("seqlen.values=[-4]", ["seqlen", "-4"]),
    ],
)
def test_bad_input_exits_2_naming_key_and_options(tmp_path, override, words):
    done = lcab_main(override, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    message = done.stderr + done.stdout
    for word in words:
        assert word in message, (word, message[-2000:])
    assert not list(tmp_path.rglob("records.jsonl")), "bad input must record nothing"


@pytest.mark.dist
def test_a_context_parallel_cell_runs_distributed_with_measured_comm(tmp_path):
    run = tmp_path / "run"
    done = lcab_main(
        "cp=ring",
        "topology=local4",
        "kernel=ranges",
        "mask=causal_document",
        "seqlen=tiny",
        "bench=quick",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(run / "records.jsonl")
    assert [r["seqlen"] for r in records] == [256, 512]
    for r in records:
        assert r["status"] == "ok", r["reasons"]
        assert r["world_size"] == 4 and r["cp"] == "ring"
        assert r["comm_bytes_measured"] == r["comm_bytes_analytic"] > 0
        assert len(r["fwd"]["rank_ms_p50"]) == 4
        assert r["fwd"]["max_abs_err"] <= r["numerics_tolerance"]


def test_resume_reruns_only_the_lengths_a_job_did_not_finish(tmp_path):
    run_dir = tmp_path / "run"
    args = ("kernel=naive", "mask=causal", "seqlen=tiny", "bench=quick", f"hydra.run.dir={run_dir}")
    first = lcab_main(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    path = run_dir / "records.jsonl"
    done, second = path.read_text().splitlines()
    # as a job killed during its second length leaves it: that length ended in a timeout
    unfinished = {**json.loads(second), "status": "timeout", "reasons": ["no result"]}
    path.write_text(done + "\n" + json.dumps(unfinished) + "\n")

    resumed = lcab_main(*args, "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert lines[0] == done  # the settled length is kept as written, not measured again
    rerun = json.loads(lines[1])
    assert (rerun["seqlen"], rerun["status"]) == (512, "ok")
    assert "1 settled record(s) kept" in resumed.stderr
