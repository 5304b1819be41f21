"""A login node without a GPU plans, checks and records GPU jobs as the GPU jobs they are.

With a launcher preset that gives each rank a GPU, ``problem.device=auto`` means the device the
job will run on (CUDA), not the submitting host's: the dry run, the pre-flight and the records
the launcher writes for a job all use the job's device and environment. ``CUDA_VISIBLE_DEVICES``
is emptied so the host has no GPU even where the machine has one, and no SLURM cluster answers.
"""

from __future__ import annotations

import json

import pytest

from lcab.bench.environment import environment
from lcab.bench.scheduled import JOB_ENVIRONMENT_FILE
from lcab.cell import JobInfo
from lcab.config import resolve_cell
from lcab.config.resolve import CPU_PROBLEM, GPU_PROBLEM
from lcab.launch.outcome import JobEnd, settle
from tests.helpers.cli import cli_env, run_lcab

GPU_PRESET = ["launcher=slurm_h100_example", "cp=ulysses", "mask=causal_document", "topology=4x8"]


def login_node_env() -> dict[str, str]:
    env = cli_env(CUDA_VISIBLE_DEVICES="")
    env.pop("SLURM_CONF", None)  # no cluster to ask: the checks that need one are skipped
    return env


@pytest.mark.slow
def test_the_gpu_preset_dry_run_from_a_gpu_less_host_plans_32_gpus(tmp_path):
    done = run_lcab("-m", *GPU_PRESET, "dry_run=true", cwd=tmp_path, env=login_node_env())
    assert done.returncode == 0, done.stderr[-3000:]
    text = " ".join(done.stdout.split())
    assert "4 nodes x 8" in text and "32 GPUs" in text  # the shape may wrap in its cell
    problem = (
        f"cuda {GPU_PROBLEM['dtype']}, heads {GPU_PROBLEM['heads_q']}:{GPU_PROBLEM['heads_kv']}"
    )
    assert problem in text
    assert "total: 1 job(s)" in text
    assert not list(tmp_path.rglob("records.jsonl"))  # nothing ran


def test_a_gpu_preset_resolves_auto_as_cuda_without_a_gpu_here(compose, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cell = resolve_cell(compose(GPU_PRESET, hydra=True))
    assert cell.device == "cuda" and cell.dtype == GPU_PROBLEM["dtype"]
    assert (cell.heads_q, cell.heads_kv, cell.head_dim) == (
        GPU_PROBLEM["heads_q"],
        GPU_PROBLEM["heads_kv"],
        GPU_PROBLEM["head_dim"],
    )
    assert cell.world_size == 32 and cell.backend == "nccl"


@pytest.mark.parametrize(
    ("overrides", "device"),
    [
        (["launcher=slurm", "cp=ring", "topology=2x2"], "cpu"),  # a preset without GPUs
        (["launcher=slurm_h100_example", "problem.device=cpu", "cp=ring", "topology=2x2"], "cpu"),
        (["cp=ring", "topology=2x2"], "cpu"),  # local: this host decides
    ],
)
def test_only_a_preset_with_gpus_per_rank_changes_what_auto_means(
    compose, monkeypatch, overrides, device
):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cell = resolve_cell(compose(overrides, hydra=True))
    assert cell.device == device and cell.heads_q == CPU_PROBLEM["heads_q"]


def test_the_ulysses_check_uses_the_job_s_heads_not_the_login_node_s(compose, monkeypatch):
    from lcab.launch.checks import slurm_problems

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("lcab.launch.checks.partitions", lambda: None)
    cfg = compose([*GPU_PRESET, "dry_run=true"], hydra=True)
    assert slurm_problems(cfg, resolve_cell(cfg)) == []  # 64 heads over 32 ranks: fine
    cfg = compose([*GPU_PRESET, "dry_run=true", "problem.heads_q=48"], hydra=True)
    (problem,) = slurm_problems(cfg, resolve_cell(cfg))
    assert "48" in problem and "32" in problem  # 48 heads do not split over 32 ranks


def test_records_the_launcher_writes_carry_the_job_s_environment(compose, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    job = JobInfo(output_dir=str(tmp_path), run_id="s-0", sweep_id="s", job_num=0)
    cell = resolve_cell(compose(GPU_PRESET, hydra=True), job)
    said = environment("cpu") | {"hostname": "gpu-node-7", "device_name": "NVIDIA H100 80GB HBM3"}
    (tmp_path / JOB_ENVIRONMENT_FILE).write_text(json.dumps(said))
    added = settle(cell, JobEnd("42", "CANCELLED"))
    assert added and all(r.hostname == "gpu-node-7" for r in added)
    assert all(r.device_name == "NVIDIA H100 80GB HBM3" and r.device == "cuda" for r in added)


def test_a_job_that_never_started_does_not_borrow_the_login_node_s_host(
    compose, tmp_path, monkeypatch
):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    job = JobInfo(output_dir=str(tmp_path), run_id="s-0", sweep_id="s", job_num=0)
    cell = resolve_cell(compose(GPU_PRESET, hydra=True), job)
    added = settle(cell, JobEnd("-", "NOT_SUBMITTED", "sbatch: error: invalid partition"))
    assert added and all(r.hostname is None and r.device_name is None for r in added)
    assert added[0].lcab_version and added[0].slurm_job_id == "-"
