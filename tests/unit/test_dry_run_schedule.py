"""The dry run checks each context-parallel job's schedule at the job's own world size.

Every rank of the job's topology runs through the strategy's real code with nothing sent
(`lcab.cp.schedule_check`); the dry run says what was checked, and a job whose schedule breaks
a rule (here: one rank creating its groups in another order, which would hang its first
``new_group`` on the cluster) is refused with the reason and priced at zero.
"""

from __future__ import annotations

from lcab.distributed.groups import Grid
from lcab.launch.dry_run import plan_rows, print_plan

JOB = [
    "launcher=slurm_h100_example",
    "problem.device=cuda",
    "seqlen.values=[8192]",
    "kernel=fa3",
    "mask=causal",
    "topology=2x8",
]


def test_the_schedule_of_each_cp_job_is_checked_at_its_world_size(capsys):
    rows = plan_rows([*JOB, "cp=usp,ring"], True)
    checked = {row.job.split("cp=")[1].split()[0]: row.schedule for row in rows}
    for name in ("usp", "ring"):
        assert checked[name].startswith("16 ranks, "), checked[name]
        assert checked[name].endswith(": matches")
    assert all(row.refused == () for row in rows)
    assert print_plan([*JOB, "cp=ring"], False) == 0
    out = capsys.readouterr().out
    heading = "schedules (every rank's own code at the job's world size, nothing sent):"
    assert f"{heading}\n  job 0: 16 ranks, " in out
    (single,) = plan_rows([*JOB[:-1], "cp=none"], False)
    assert single.schedule == ""  # one device: nothing to check


def test_a_job_whose_ranks_would_make_their_groups_in_another_order_is_refused(monkeypatch):
    real = Grid.create_groups

    def reordered(self, dist):
        if self.rank == 11:  # the rings before the Ulysses groups, on one rank only
            for ring in self.rings():
                dist.group(ring)
        return real(self, dist)

    monkeypatch.setattr(Grid, "create_groups", reordered)  # the forked workers inherit it
    (row,) = plan_rows([*JOB, "cp=usp"], False)
    assert row.refused and row.refused[0].startswith(
        "schedule check: rank 11 build new_group #1: creates group of ranks 0, 8 where rank 0 "
        "creates group of ranks 0..7"
    )
    assert row.gpu_hours == 0
