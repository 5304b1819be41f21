"""A sweep is not refused for one cell that cannot be built: that cell is a ``skipped`` record.

Following the dry run's own hint (``seqlen=per_device_8k``) at ``topology=8x8,12x8`` exited 2
for the whole sweep because Ulysses cannot split 64 heads over 96 ranks. In a multirun such a
cell now passes the pre-flight, the dry run marks it (priced at zero), and the SLURM launcher
writes its records — ``skipped``, with the reason — without holding nodes to say so. A single
run of it still exits 2.
"""

from __future__ import annotations

import pytest

from lcab.cell import JobInfo
from lcab.config import resolve_cell
from lcab.launch.dry_run import plan_rows
from lcab.launch.outcome import NOT_BUILDABLE, JobEnd, settle
from lcab.launch.refusals import FRONTIER_ON_SLURM, layout_problems
from tests.helpers.cli import run_lcab

SWEEP = ["launcher=slurm_h100_example", "cp=ulysses", "seqlen=per_device_8k", "dry_run=true"]


@pytest.mark.slow
def test_the_sweep_runs_and_marks_the_cell_a_single_run_is_refused():
    sweep = run_lcab("-m", *SWEEP, "topology=8x8,12x8")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    text = " ".join(sweep.stdout.split())
    assert "job 1 would end skipped: heads_q=64 is not divisible by the Ulysses degree 96" in text
    assert "(1 would end skipped and cost nothing)" in text
    single = run_lcab(*SWEEP, "topology=12x8")
    assert single.returncode == 2
    assert "cp=ulysses on topology=12x8: heads_q=64 is not divisible" in single.stderr


def test_the_launcher_settles_such_a_cell_as_skipped_records(compose, tmp_path):
    cfg = compose(["cp=ulysses", "topology=12x8", "problem.device=cuda", "seqlen=short"])
    cell = resolve_cell(cfg, JobInfo(output_dir=str(tmp_path), run_id="s-1", sweep_id="s"))
    why = layout_problems(cell, "12x8")
    assert why == [
        "cp=ulysses on topology=12x8: heads_q=64 is not divisible by the Ulysses degree 96"
    ]
    records = settle(cell, JobEnd("-", NOT_BUILDABLE, "; ".join(why)))
    assert [r.seqlen for r in records] == list(cell.seqlens)
    assert all(record.status == "skipped" for record in records)
    assert f"not submitted: {why[0]}" in " ".join(records[0].reasons)  # the others point to it
    fits = compose(["cp=ulysses", "topology=8x8", "problem.device=cuda"])
    assert layout_problems(resolve_cell(fits), "8x8") == []


def test_a_frontier_search_is_never_a_multi_task_slurm_job(compose, tmp_path):
    """Each probe is a fresh world; a job's tasks are one world: not submitted, skipped."""
    cfg = compose(["cp=ring", "topology=2x8", "problem.device=cuda", "seqlen=frontier"])
    cell = resolve_cell(cfg, JobInfo(output_dir=str(tmp_path), run_id="f-1", sweep_id="f"))
    why = layout_problems(cell, "2x8")
    assert why == [FRONTIER_ON_SLURM]
    (record,) = settle(cell, JobEnd("-", NOT_BUILDABLE, "; ".join(why)))
    assert record.status == "skipped" and FRONTIER_ON_SLURM in " ".join(record.reasons)
    alone = compose(["cp=none", "problem.device=cuda", "seqlen=frontier"])
    assert layout_problems(resolve_cell(alone), "auto") == []  # one task: its own probes
    slurm = ["launcher=slurm_h100_example", "problem.device=cuda", "seqlen=frontier"]
    (ring,) = plan_rows([*slurm, "cp=ring", "topology=2x8"], True)
    assert ring.refused == (FRONTIER_ON_SLURM,) and ring.gpu_hours == 0
    (one,) = plan_rows([*slurm, "cp=none"], True)
    assert one.refused == ()
