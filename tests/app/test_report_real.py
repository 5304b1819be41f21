"""The report of a real sweep: ``python -m lcab.main -m ...`` then ``python -m lcab.report build``.

Both are the commands a user types, run in subprocesses; the assertions read what the report
wrote and compare it with the records the sweep wrote.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env, read_jsonl, run_lcab

pytestmark = pytest.mark.slow


def test_a_real_sweeps_report_has_a_page_pngs_and_one_summary_row_per_record(tmp_path):
    sweep = tmp_path / "sweep"
    done = run_lcab(
        "-m",
        "kernel=ranges,sdpa",
        "mask=causal,document",
        "seqlen.values=[256,512]",
        "bench=quick",
        "bench.progress=false",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(sweep / "records.jsonl")
    assert len(records) == 8

    built = subprocess.run(
        [sys.executable, "-m", "lcab.report", "build", str(sweep)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    report = sweep / "report"
    assert f"page: {report / 'index.html'}" in built.stdout
    assert f"PNGs: {report / 'png'}" in built.stdout
    assert (report / "index.html").stat().st_size > 1_000_000  # plotly.js is inlined
    for name in ("summary.csv", "summary.md", "reasons.csv", "reasons.md"):
        assert (report / name).exists(), name
    pngs = {p.stem for p in (report / "png").glob("*.png")}
    masks = {r["mask"] for r in records}
    expected = {"support_kernels"} | {
        f"{kind}_{mask}" for kind in ("throughput", "memory", "numerics") for mask in masks
    }
    assert pngs == expected
    with open(report / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["run_id"] for r in rows) == sorted(r["run_id"] for r in records)
    by_id = {r["run_id"]: r for r in records}
    for row in rows:  # a CPU sweep: GFLOP/s, as the console says
        assert float(row["fwd_gflops"]) == pytest.approx(
            by_id[row["run_id"]]["fwd"]["tflops"] * 1e3
        )


def test_a_path_without_records_exits_2_and_says_which(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "lcab.report", "build", str(tmp_path / "missing")],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert str(tmp_path / "missing") in done.stderr
    assert not Path(tmp_path / "missing").exists()


def _filter_values(node):
    if isinstance(node, dict):
        if {"key", "op", "value"} <= node.keys():
            return [node["value"]]
        return [v for child in node.values() for v in _filter_values(child)]
    if isinstance(node, list):
        return [v for child in node for v in _filter_values(child)]
    return []


def test_the_wandb_workspace_command_writes_the_sweeps_views_offline(tmp_path):
    sweep = tmp_path / "2026-11-23" / "10-00-00_abc123"
    done = run_lcab(
        "-m",
        "kernel=ranges,sdpa",
        "mask=causal",
        "seqlen.values=[128]",
        "bench=quick",
        "bench.progress=false",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "ws.json"
    env = {k: v for k, v in cli_env().items() if not k.startswith("WANDB_")}
    cmd = [sys.executable, "-m", "lcab.report", "wandb-workspace", str(sweep), "--entity", "team"]
    dry = subprocess.run(
        [*cmd, "--dry-run", str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    spec = json.loads(out.read_text())
    assert _filter_values(spec) == ["2026-11-23_10-00-00_abc123"]  # the sweep's dated group
    text = json.dumps(spec)
    for metric in ("fwd_tflops", "bwd_tflops", "fwd_mem_peak_mib", "n_ok"):
        assert f'"{metric}"' in text, metric
    # saving needs a login: without one it says how, and fails
    saved = subprocess.run(
        cmd, env={**env, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120
    )
    assert saved.returncode == 1 and "wandb login" in saved.stderr
