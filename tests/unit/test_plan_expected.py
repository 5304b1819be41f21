"""The dry run's expectation of a job (`lcab.plan.expected`): calls per pass and GPU-hours.

Calls per pass are counted by hand from the protocol; the expected GPU-hours are rebuilt from
the planner's own predictions with those counts.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from lcab.cell import BenchConfig
from lcab.config import resolve_cell
from lcab.config.preflight import composed_jobs
from lcab.plan.expected import calls_per_pass, expect_job, plan_cell
from lcab.plan.hardware import load_profile
from lcab.plan.predict import PlanCell, predict_median


def test_calls_per_pass_counts_the_protocol() -> None:
    bench = BenchConfig(warmup=2, reps=5, check_numerics=True)
    assert calls_per_pass(bench, 3.0) == 1 + 2 + 5 + 1
    assert calls_per_pass(dataclasses.replace(bench, check_numerics=False), 3.0) == 8
    budget = BenchConfig(warmup_ms=10.0, rep_ms=100.0, max_reps=1000, check_numerics=False)
    assert calls_per_pass(budget, 3.0) == 1 + 4 + 34  # ceil(10/3), ceil(100/3)
    capped = dataclasses.replace(budget, max_reps=20)
    assert calls_per_pass(capped, 3.0) == 1 + 4 + 20
    assert calls_per_pass(budget, 500.0) == 1 + 1 + 1  # a budget buys at least one rep
    # on a GPU read through NVML, an energy window of 1.25 s: 417 calls of 3 ms, 3 of 500 ms
    assert calls_per_pass(budget, 3.0, gpu=True) == 1 + 4 + 34 + 417
    assert calls_per_pass(budget, 500.0, gpu=True) == 1 + 1 + 1 + 3
    off = dataclasses.replace(budget, telemetry="off")
    assert calls_per_pass(off, 3.0, gpu=True) == 1 + 4 + 34


def cell_of(*overrides: str):
    ((_, cfg),) = list(composed_jobs(list(overrides), False))
    return resolve_cell(cfg)


@pytest.mark.parametrize("cp", ["ring", "none"])
def test_expected_gpu_hours_rebuild_from_the_planner(cp: str) -> None:
    topology = "topology=2x8" if cp != "none" else "topology=single"
    cell = cell_of(
        f"cp={cp}", "kernel=fa3", "mask=causal", "seqlen.values=[65536]", topology,
        "problem.device=cuda", "problem.dtype=bfloat16", "problem.heads_q=64",
        "problem.heads_kv=8", "problem.head_dim=128",
    )  # fmt: skip
    hardware = load_profile("h100_nvlink_ib")
    job = expect_job(cell, hardware)
    (length,) = job.lengths
    want = predict_median(plan_cell(cell, 65536), hardware, cell.mask_samples)
    assert length.prediction is not None
    assert length.prediction.fwd.tflops == pytest.approx(float(want.fwd.tflops))
    fwd, bwd = float(want.fwd.time_ms), float(want.bwd.time_ms)
    per = {"fwd": fwd, "bwd": bwd}
    wall_ms = sum(calls_per_pass(cell.bench, per[p], True) * per[p] for p in cell.bench.passes)
    wall_ms += fwd if "bwd" in cell.bench.passes else 0.0
    gpus = cell.nodes * cell.devices_per_node
    assert job.gpus == gpus
    assert job.gpu_hours == pytest.approx(gpus * cell.mask_samples * wall_ms / 1000 / 3600)
    if cp == "none":
        assert plan_cell(cell, 65536) == PlanCell.of_cell(cell, 65536).with_(
            cp="ulysses", cp_options={}, nodes=1, devices_per_node=1
        )


def test_a_length_the_planner_cannot_predict_says_why() -> None:
    cell = cell_of(
        "cp=ulysses", "kernel=fa3", "mask=causal", "seqlen.values=[65536]", "topology=4x8",
        "problem.device=cuda", "problem.heads_q=8", "problem.heads_kv=8",
    )  # fmt: skip
    (length,) = expect_job(cell, load_profile("h100_nvlink_ib")).lengths
    assert length.prediction is None and "Ulysses degree" in length.reason
    assert "no prediction" in length.text()


def test_hardware_auto_in_a_dry_run_follows_the_job_s_device(compose):
    from lcab.config import resolve_cell
    from lcab.plan.expected import hardware_for
    from lcab.plan.hardware import GPU_PROFILE

    cfg = compose(["hardware=auto", "problem.device=cuda", "kernel=fa3", "cp=ring"])
    assert hardware_for(cfg, resolve_cell(cfg)).name == GPU_PROFILE  # not this CPU host's


def test_hardware_auto_on_cpu_is_the_fitted_cpu_profile_on_this_hosts_cores(compose):
    from lcab.plan.expected import hardware_for
    from lcab.plan.hardware import CPU_PROFILE

    cfg = compose(["hardware=auto", "problem.device=cpu", "kernel=ranges", "cp=ring"])
    auto, fitted = hardware_for(cfg, resolve_cell(cfg)), load_profile(CPU_PROFILE)
    assert auto.name == f"{CPU_PROFILE}@auto" and auto.device == "cpu"
    assert (auto.kernels, auto.memory_gbps, auto.intra, auto.inter) == (
        fitted.kernels, fitted.memory_gbps, fitted.intra, fitted.inter
    )  # fmt: skip
    assert auto.compute_slots_per_node == len(os.sched_getaffinity(0))
