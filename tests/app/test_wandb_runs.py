"""One W&B run per cell, made for comparison — checked by decoding the offline run files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lcab.records.schema import RunRecord
from tests.helpers.cli import run_lcab, wandb_env
from tests.helpers.wandb_offline import offline_runs

pytestmark = pytest.mark.slow


def lcab_main(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return run_lcab(*args, cwd=tmp_path, env=wandb_env(tmp_path))


CELL = (
    "-m",
    "kernel=naive",
    "mask=causal",
    "seqlen.values=[256,8192]",
    "bench=quick",
    "bench.timeout_s=6",
    "logger=wandb",
    "debug=default",
)


def test_a_cell_is_one_comparable_run_and_resume_continues_it(tmp_path):
    sweep = tmp_path / "2026-01-02" / "03-04-05_abcdef"
    done = lcab_main(tmp_path, *CELL, f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = offline_runs(sweep)
    assert run.group == "2026-01-02_03-04-05_abcdef"  # the sweep, dated
    assert "logger" not in run.name and "debug" not in run.name and "kernel=naive" in run.name
    assert {"naive", "none", "causal", "world1", "float32", "cpu"} <= set(run.tags)
    # config = what ran, resolved
    assert run.config["dtype"] == "float32" and run.config["device"] == "cpu"
    assert run.config["heads_q"] == 8 and run.config["world_size"] == 1
    assert run.config["seqlens"] == [256, 8192] and run.config["git_sha"]
    # history: one step per length, seqlen the step metric, string statuses
    assert [(h["seqlen"], h["status"]) for h in run.history] == [(256, "ok"), (8192, "timeout")]
    assert run.metrics.get("*") == "seqlen"
    # summary: per-length values and statuses, counts, a named headline; no last-step values
    s = run.summary
    assert s["status/256"] == "ok" and s["status/8192"] == "timeout"
    assert s["n_ok"] == 1 and s["n_timeout"] == 1 and s["status_counts"] == {"ok": 1, "timeout": 1}
    assert s["headline/seqlen"] == 256 and s["headline/fwd_tflops"] == s["fwd_tflops/256"] > 0
    assert "fwd_tflops" not in s and "fwd_ms_p50" not in s
    # one records-table schema for every run: all record columns
    assert s["records"]["ncols"] == len(RunRecord().flat()) and s["records"]["nrows"] == 2
    assert run.exit_code == 0

    again = lcab_main(tmp_path, *CELL, "resume=true", f"hydra.sweep.dir={sweep}")
    assert again.returncode == 0, again.stderr[-3000:]
    runs = offline_runs(sweep)
    assert len(runs) == 2 and {r.run_id for r in runs} == {run.run_id}  # the same W&B run


def test_a_cell_whose_every_length_failed_ends_its_run_failed(tmp_path):
    sweep = tmp_path / "sweep"
    done = lcab_main(
        tmp_path,
        "kernel=naive",
        "mask=causal",
        "seqlen.values=[8192]",
        "bench=quick",
        "bench.timeout_s=3",
        "logger=wandb",
        f"hydra.run.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = offline_runs(sweep)
    assert run.summary["n_timeout"] == 1 and run.exit_code == 1
