"""One W&B run per cell, made for comparison — checked by decoding the offline run files."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from lcab.records.schema import RunRecord
from tests.helpers.cli import read_jsonl, run_lcab, wandb_env
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


SECRETS = {
    "WANDB_API_KEY": "f" * 40,
    "HF_TOKEN": "hf_fake_token_xyz",
    "AWS_SECRET_ACCESS_KEY": "aws_fake_secret_q9z",
}


def test_profiled_cp_cell_logs_traces_records_and_mask_and_keeps_everything_in_its_folder(
    tmp_path,
):
    home = tmp_path / "home"
    # W&B's data and cache folders left to lcab (not pointed into tmp as wandb_env does)
    env = {
        k: v
        for k, v in wandb_env(tmp_path).items()
        if k not in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR")
    }
    env |= {**SECRETS, "WANDB_MODE": "offline", "MPLCONFIGDIR": str(tmp_path / "mpl")}
    run_dir = tmp_path / "run"
    done = run_lcab(
        "cp=ring",
        "topology=local2",
        "mask=causal",
        "seqlen.values=[128,256]",
        "bench=quick",
        "bench.profile=true",
        "bench.profile_reps=2",
        "bench.progress=false",
        "logger=wandb",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["status"] for r in read_jsonl(run_dir / "records.jsonl")] == ["ok", "ok"]

    # one Chrome trace per (length, pass, rank), with the pass and the CP phases as ranges
    traces = sorted(p.name for p in (run_dir / "traces").iterdir())
    assert traces == [
        f"S{s}-{p}-rank{r}.json" for s in (128, 256) for p in ("bwd", "fwd") for r in (0, 1)
    ]
    for name in traces:
        events = json.loads((run_dir / "traces" / name).read_text())["traceEvents"]
        names = Counter(e.get("name") for e in events)
        passed = name.split("-")[1]
        assert names[f"lcab.{passed}"] == 2  # one range per profiled repetition
        assert names["lcab.cp.compute"] > 0 and names["lcab.cp.comm"] + names["lcab.cp.wait"] > 0
    assert (run_dir / "mask-S256.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (run,) = offline_runs(run_dir)
    assert set(run.artifacts["lcab-records"]) == {"records.jsonl", "records.csv", "mask-S256.png"}
    assert set(run.artifacts["lcab-trace"]) == {f"traces/{name}" for name in traces}
    assert run.summary["mask"]["_type"] == "image-file"
    # every payload W&B will upload lies inside the run folder
    for files in run.artifacts.values():
        for local in files.values():
            assert (run_dir / local).resolve().is_relative_to(run_dir.resolve()), local
    wandb_in_home = (
        [p for p in home.rglob("*") if "wandb" in str(p).lower()] if home.exists() else []
    )
    assert wandb_in_home == []
    # no secret from the environment in any file of the run folder
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            leaked = [k for k, v in SECRETS.items() if v.encode() in data]
            assert not leaked, f"{leaked} in {path}"
