"""``dry_run=true`` shows what the planner expects of each job, the same as ``python -m lcab.plan``.

The dry run and the planner are run as a user runs them, in subprocesses, on the same cell; the
dry run's per-length TFLOP/s must be the planner's (printed to 3 significant figures), for a
context-parallel cell and a single-device one; the profile follows the job's device unless
``hardware=`` picks one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, cli_env, run_lcab

CELL = ["kernel=fa3", "mask=causal", "seqlen=short", "seqlen.values=[131072]"]
PREDICTED = re.compile(r"131,072(?: \([\d,]+/rank\))?: ([\d.e+]+) / ([\d.e+]+) \(")


def planner(tmp_path: Path, *overrides: str) -> dict:
    """The row ``python -m lcab.plan`` writes for the cell."""
    out = tmp_path / "plan"
    cmd = [sys.executable, "-m", "lcab.plan", *overrides, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [json.loads(line) for line in (out / "plan.jsonl").read_text().splitlines()]
    return row


@pytest.mark.parametrize(
    ("cp", "topology", "plan_cp"),
    [("ring", "2x8", "ring"), ("none", "single", "ulysses")],
)
def test_dry_run_prediction_is_the_planners(cp, topology, plan_cp, tmp_path) -> None:
    launcher = ["launcher=slurm_h100_example"] if cp != "none" else []
    dry = run_lcab(
        *launcher, f"cp={cp}", f"topology={topology}", "problem.device=cuda", *CELL,
        "dry_run=true",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "predicted fwd / bwd TFLOP/s per GPU (time)" in dry.stdout
    match = PREDICTED.search(dry.stdout)  # a length's prediction keeps to one line
    assert match, dry.stdout[-3000:]
    expected = re.search(r"expected: ([\d.e+-]+) GPU-hours of measurement", dry.stdout)
    assert expected and float(expected.group(1)) > 0
    # the planner on the same cell (cp=none: one rank, i.e. ulysses on a 1x1 topology)
    plan_topology = "topology=single" if cp == "none" else f"topology={topology}"
    row = planner(tmp_path, f"cp={plan_cp}", plan_topology, *CELL)
    assert float(match.group(1)) == pytest.approx(row["fwd_tflops"], rel=5e-3)
    assert float(match.group(2)) == pytest.approx(row["bwd_tflops"], rel=5e-3)


def test_dry_run_profile_follows_the_device_and_hardware_picks_another() -> None:
    cpu = ["cp=ring", "topology=local4", "problem.device=cpu", "mask=causal", "dry_run=true"]
    default = run_lcab(*cpu)
    assert default.returncode == 0, default.stderr[-2000:]
    assert "(hardware cpu_gloo_local;" in default.stdout
    chosen = run_lcab(*cpu, "hardware=h100_nvlink_ib")
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert "(hardware h100_nvlink_ib;" in chosen.stdout
    wrong = run_lcab(*cpu, "hardware=no_such_profile")
    assert wrong.returncode == 2 and "no_such_profile" in wrong.stderr


def test_dry_run_says_tokens_per_rank_and_warns_the_96_gpu_default_lengths() -> None:
    """The issue's 96-GPU cell: the default lengths leave 11-86 tokens per rank (warned, with
    the pointer); 8K tokens per GPU are not warned."""
    dry = run_lcab(
        "-m", "launcher=slurm_h100_example", "cp=ring", "kernel=fa3", "mask=causal_document",
        "topology=12x8", "problem.device=cuda", "seqlen=short,per_device_8k", "dry_run=true",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-2000:]
    for length, per_rank in ((1024, 11), (8192, 86), (786432, 8192)):
        assert f"{length:,} ({per_rank:,}/rank):" in dry.stdout, dry.stdout[-3000:]
    notes = " ".join(dry.stdout.split("└")[-1].split())  # the numbered notes under the table
    warnings = re.findall(r"\[\d+\] (job \d+: .*?)(?= \[\d+\] |total:)", notes)
    assert len(warnings) == 1 and warnings[0].startswith("job 0: "), warnings
    assert "as few as 11 tokens" in warnings[0] and "seqlen=per_device_8k" in warnings[0]
