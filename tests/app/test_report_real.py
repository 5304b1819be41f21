"""The report of a real sweep: ``python -m lcab.main -m ...`` then ``python -m lcab.report build``.

Both are the commands a user types, run in subprocesses; the assertions read what the report
wrote and compare it with the records the sweep wrote.
"""

from __future__ import annotations

import csv
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
    for row in rows:
        assert float(row["fwd_tflops"]) == by_id[row["run_id"]]["fwd"]["tflops"]


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
