"""The dry run prices a job that would end ``skipped`` at zero, says why, and counts it apart.

``kernel=fa3,sdpa_flash mask=share_question problem.device=cuda`` was priced at 561 and 358
TFLOP/s per GPU, though both pairs are unsupported and both jobs would come back ``skipped``.
The refusal is the runner's own check (`Kernel.not_supported_reasons`, the strategy's under
CP) at the job's first length, less what belongs to the machine the dry run runs on — a
package or a GPU a login node lacks (the job runs elsewhere).
"""

from __future__ import annotations

import pytest

from lcab.launch.dry_run import plan_rows, print_plan
from lcab.plan.expected import expect_configured_job
from lcab.plan.frontier import predict_frontier
from lcab.plan.hardware import load_profile
from lcab.plan.predict import PlanCell

GPU = ["launcher=slurm_h100_example", "problem.device=cuda", "seqlen.values=[8192]"]


def test_jobs_the_kernels_refuse_are_marked_with_the_reason_and_cost_nothing():
    rows = plan_rows([*GPU, "kernel=fa3,sdpa_flash,flex", "mask=share_question"], True)
    refused = {row.job.split("kernel=")[1].split()[0]: row.refused for row in rows}
    assert refused["fa3"] and "not expressible as varlen" in refused["fa3"][0]
    assert refused["sdpa_flash"] and "takes no attn_mask" in refused["sdpa_flash"][0]
    assert refused["flex"] == ()  # FlexAttention takes any mask: it runs
    for row in rows:
        assert (row.gpu_hours == 0) == bool(row.refused)
        assert row.gpu_hours == 0 or row.gpu_hours == row.shape.gpu_hours()


def test_what_this_machine_lacks_is_no_refusal():
    """fa3 needs CUDA and its package, which a login node may lack: the job still runs there."""
    (row,) = plan_rows([*GPU, "kernel=fa3", "mask=causal"], False)
    assert row.refused == ()
    (cp,) = plan_rows([*GPU, "kernel=fa3", "mask=causal", "cp=ring", "topology=2x8"], False)
    assert cp.refused == ()


def test_the_plan_prints_the_refusals_as_notes_and_counts_them_apart(capsys):
    assert print_plan([*GPU, "kernel=fa3,flex", "mask=share_question"], True, None) == 0
    out = capsys.readouterr().out
    assert "[1] job 0 would end skipped: mask not expressible as varlen" in " ".join(out.split())
    assert "total: 2 job(s) (1 would end skipped and cost nothing)" in out
    assert all(len(line) <= 120 for line in out.splitlines() if not line.startswith("total"))


@pytest.mark.slow
def test_a_cpu_dry_run_speaks_in_cpu_units(capsys):
    cpu = ["kernel=ranges", "mask=causal", "problem.device=cpu", "seqlen.values=[1024]"]
    assert print_plan(cpu, False, expect_configured_job) == 0
    out = capsys.readouterr().out
    assert "predicted fwd / bwd GFLOP/s (time)" in out and "GPU" not in out
    assert "h of wall time" in out and "CPU core-hours" in out
    assert "e+0" not in out  # times as people read them


def test_a_frontier_search_is_priced_at_the_probes_the_planner_predicts(capsys):
    cpu = ["kernel=ranges", "mask=causal", "seqlen=frontier", "bench.memory_budget_gib=0.25"]
    (row,) = plan_rows(cpu, False, expect_configured_job)
    assert row.expectation is not None
    cell = PlanCell("none", "ranges", "causal", 1024, 1, 1, 8, 2, 64, "float32")
    hardware = load_profile("cpu_gloo_local")
    search = predict_frontier(cell, 0.25 * 1024, True, 1 << 20, 16, hardware)
    *probes, timed = row.expectation.lengths
    assert [length.seqlen for length in probes] == list(search.probes)
    assert len(search.probes) > 3  # doubling, then bisection
    # each probe runs once (first call, one rep), the frontier the protocol (+2 warm-up, 5 reps);
    # a timed backward repeats on one forward
    (probe,) = [p for p in probes if p.seqlen == search.tokens]
    assert timed.seqlen == search.tokens and timed.prediction is not None
    fwd, bwd = float(timed.prediction.fwd.time_ms), float(timed.prediction.bwd.time_ms)
    assert timed.wall_s / probe.wall_s == pytest.approx(
        (8 * fwd + 8 * bwd + fwd) / (3 * fwd + 2 * bwd)
    )
    assert print_plan(cpu, False, expect_configured_job) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"priced at the {len(search.probes)} probes of the same search" in out
