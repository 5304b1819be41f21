"""``python -m lcab.plan`` as a user runs it: predictions, a topology sweep with its plot, bad
input (exit 2), the record commands."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from lcab.plan.app import assumed
from lcab.plan.hardware import load_profile
from lcab.plan.predict import PlanCell
from tests.helpers.cli import ROOT, cli_env


def plan(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lcab.plan", *args],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_topology_sweep_predicts_every_world_and_plots_them(tmp_path):
    sweep = tmp_path / "sweep"
    done = plan(
        "-m",
        "cp=ulysses,usp",
        "topology=2x8,4x8",
        "mask=causal",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr
    rows = [
        json.loads(line) for p in sweep.rglob("plan.jsonl") for line in p.read_text().splitlines()
    ]
    assert sorted((r["cp"], r["world"]) for r in rows) == [
        ("ulysses", 16),
        ("ulysses", 32),
        ("usp", 16),
        ("usp", 32),
    ]
    for r in rows:
        assert r["seqlen"] == 8192 * r["world"]  # per_device_8k: weak scaling
        assert 0 < r["fwd_tflops"] < 989  # below the H100's dense bf16 peak
        parts = r["fwd_compute_ms"] + r["fwd_comm_ms"] + r["fwd_imbalance_ms"]
        assert abs(parts - r["fwd_time_ms"]) < 1e-3  # rows are rounded to 4 decimals
    usp = {r["world"]: r for r in rows if r["cp"] == "usp"}
    assert usp[16]["ulysses"] == 8 and usp[16]["ring"] == 2  # Ulysses inside the node
    assert (sweep / "plan_tflops.png").stat().st_size > 10_000
    # one table of the sweep (not one per job), within 120 columns off a terminal, nothing cut
    assert done.stdout.count("TFLOP/s/GPU") == 1 and "plan of 4 cells" in done.stdout
    assert all(len(line) <= 120 for line in done.stdout.splitlines())
    assert "…" not in done.stdout

    # the same sweep directory again, for one of those cells: its table holds that job alone,
    # whose file it rewrites, and the other jobs' folders are left as they were
    again = plan("-m", "cp=ulysses", "topology=2x8", "mask=causal", f"hydra.sweep.dir={sweep}")
    assert again.returncode == 0, again.stderr
    assert "plan of 1 cells" in again.stdout
    files = {p.parent.name: p.read_text().splitlines() for p in sweep.rglob("plan.jsonl")}
    assert len(files) == 4 and all(len(lines) == 1 for lines in files.values())


def test_recommend_names_the_best_strategy_its_margin_and_the_smallest_world():
    done = plan("recommend=true", "mask=causal_document", "topology=2x8")
    assert done.returncode == 0, done.stderr
    assert "best:" in done.stdout and "faster than the runner-up" in done.stdout
    assert "smallest world" in done.stdout
    # what it assumed, first: the planner's defaults (conf/plan.yaml), 8K per GPU on 16 GPUs
    # (131,072 tokens: above ProLong64K's 64K, so doc_source=auto draws from ProLong512K)
    assert " ".join(done.stdout.split()).startswith(
        "recommendation assuming kernel fa3, bfloat16 64:8 heads x 128, mask causal_document "
        "(doc_source=auto, i.e. prolong512k at this length), S=131,072 (8,192 per GPU) on 2x8 "
        "GPUs, hardware profile h100_nvlink_ib (median of 3 mask samples)"
    )


def test_a_recommendation_names_the_document_source_it_assumed():
    cell = PlanCell("ulysses", "fa3", "causal_document", 8192, 1, 8, 64, 8, 128, "bfloat16")
    long = replace(cell, mask_params={"doc_source": "long"})
    assert "mask causal_document (doc_source=long), S=8,192 (1,024 per GPU) on 1x8 GPUs" in (
        assumed(long, load_profile("h100_nvlink_ib"), 1)
    )
    cpu = assumed(replace(cell, mask="causal"), load_profile("cpu_gloo_local"), 1)
    assert "mask causal, S=8,192 (1,024 per rank) on 1x8 ranks" in cpu and "doc_source" not in cpu


def test_a_kernel_the_profile_has_no_rate_for_is_planned_with_a_note_saying_so(tmp_path):
    done = plan("kernel=sdpa", "mask=causal", "topology=1x8", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    note = " ".join(done.stderr.split())
    assert "sdpa has no figures in hardware profile h100_nvlink_ib" in note
    assert "costed at the profile's default (fa3's rate)" in note
    fa3 = plan("kernel=fa3", "mask=causal", "topology=1x8", f"hydra.run.dir={tmp_path}")
    assert fa3.returncode == 0 and "no figures" not in fa3.stderr and "costed at" not in fa3.stderr


def test_bad_input_exits_2_naming_the_key_and_the_valid_options():
    bad_hw = plan("hardware=tpu")
    assert bad_hw.returncode == 2
    assert "hardware" in bad_hw.stderr and "h100_nvlink_ib" in bad_hw.stderr
    bad_cp = plan("cp=none")
    assert bad_cp.returncode == 2 and "cp=none runs on one device" in bad_cp.stderr
    missing = plan("--check", "no/such/records.jsonl")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    flag = plan("--check")
    assert flag.returncode == 2
    records = "notebooks/data/plan_cpu_records.jsonl"
    bad_where = plan("--check", records, "--where", "ranks=2")
    assert bad_where.returncode == 2
    assert "'ranks' is no record field" in bad_where.stderr and "world_size" in bad_where.stderr
    no_values = plan("--check", records, "--where", "world_size")
    assert no_values.returncode == 2 and "FIELD=V1,V2" in no_values.stderr
    bad_set = plan("--published", "--set", "kernels.sdpa.call_us=5")
    assert bad_set.returncode == 2
    assert "'kernels.sdpa.call_us' does not exist" in bad_set.stderr
    assert "kernels.fa3.call_us" in bad_set.stderr  # a valid key, named
    not_a_number = plan("--published", "--set", "memory_gbps=fast")
    assert not_a_number.returncode == 2 and "KEY=NUMBER" in not_a_number.stderr
    bad_harness = plan("harness=te")
    assert bad_harness.returncode == 2
    assert "harness='te'" in bad_harness.stderr and "lcab, longca" in bad_harness.stderr


def test_the_published_baselines_harness_costs_the_same_cell_differently(tmp_path):
    sweep = tmp_path / "sweep"
    done = plan(
        "-m",
        "harness=lcab,longca",
        "cp=usp",
        "mask=causal",
        "topology=2x8",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr
    rows = {
        r["harness"]: r
        for p in sweep.rglob("plan.jsonl")
        for r in map(json.loads, p.read_text().splitlines())
    }
    assert sorted(rows) == ["lcab", "longca"]
    # USP on 2 nodes: Ulysses over a node's 8 GPUs, a ring of two across the nodes, so every
    # ring transfer leaves the node. A K/V block: K and V of 64K tokens x 1 KV head x d 128.
    block = 2 * 65536 * 1 * 128
    moved = {h: r["fwd_inter_bytes"] + r["bwd_inter_bytes"] for h, r in rows.items()}
    # lcab: K/V forward and backward (bf16), then the float32 dK/dV after each of the 2 steps
    assert moved["lcab"] == block * 2 * 2 + 2 * block * 4
    # the published code: K/V forward and backward, dK/dV in bf16 with the next block (once)
    assert moved["longca"] == 3 * block * 2
    assert "longca" in done.stdout


def test_check_on_records_without_a_usable_record_says_so(tmp_path: Path):
    from lcab.records.schema import RunRecord

    path = tmp_path / "records.jsonl"
    path.write_text(RunRecord(kernel="ranges", cp="ring", status="error").to_json() + "\n")
    done = plan("--check", str(path))
    assert done.returncode == 2 and "no ok records" in done.stderr


def test_a_sweep_predicted_on_every_core_prints_what_one_process_predicts(tmp_path):
    """The pre-flight's workers predict the jobs (`PredictAhead`); each job's rows must be the
    ones the planner makes for that cell by itself, in this process, to the written digit."""
    from lcab.plan.app import hardware_of, harness_of
    from lcab.plan.predict import PlanCell, predict_median

    sweep = tmp_path / "sweep"
    axes = ["cp=ring,usp,loongtrain", "topology=1x8,4x8", "mask=causal_document"]
    done = plan("-m", *axes, f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr
    written = {
        (r["cp"], r["world"], r["seqlen"]): r
        for p in sweep.rglob("plan.jsonl")
        for r in map(json.loads, p.read_text().splitlines())
    }
    assert len(written) == 6
    from hydra import compose, initialize_config_dir

    from lcab.config import CONF_DIR, register_configs, resolve_cell

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for cp in ("ring", "usp", "loongtrain"):
            for topology in ("1x8", "4x8"):
                cfg = compose("plan", overrides=[f"cp={cp}", f"topology={topology}", axes[2]])
                cell = resolve_cell(cfg)
                for seqlen in cell.seqlens:
                    target = PlanCell.of_cell(cell, seqlen)
                    alone = predict_median(
                        target, hardware_of(cfg), cell.mask_samples, harness_of(cfg)
                    ).row()
                    row = written[(cp, target.world, seqlen)]
                    assert {k: row[k] for k in alone} == json.loads(json.dumps(alone))
