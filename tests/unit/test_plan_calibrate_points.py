"""Measured records become calibration points: one per cell and pass, at the median of its runs.

A CP cell measured three times (``launchers/plan_cpu_measurements.sh`` runs its sweep three
times) must count once, at the median of its runs, so that one stalled run neither moves the
point nor weighs triple in a fit. The expectations are medians computed here by hand.
"""

from __future__ import annotations

import pytest

from lcab.plan.calibrate import points_of
from lcab.records.schema import RunRecord


def _record(cp: str, world: int, fwd_ms: float | None, bwd_ms: float | None) -> RunRecord:
    record = RunRecord(
        kernel="ranges",
        cp=cp,
        mask="causal",
        seqlen=256 * world,
        status="ok",
        heads_q=4,
        heads_kv=2,
        head_dim=16,
        dtype="float32",
        world_size=world,
        nodes=1,
        devices_per_node=world,
        mask_seed=0,
        config={"mask": {}, "cp": {}},
    )
    for pass_, ms in (("fwd", fwd_ms), ("bwd", bwd_ms)):
        if ms is not None:
            record.pass_result(pass_).status = "ok"
            record.pass_result(pass_).ms_p50 = ms
    return record


def _by_pass(points, cp="ring", world=2):
    return {p.pass_: p for p in points if (p.cell.cp, p.cell.world) == (cp, world)}


def test_three_runs_of_a_cell_give_one_point_per_pass_at_their_median():
    runs = [_record("ring", 2, fwd, bwd) for fwd, bwd in ((10.0, 50.0), (30.0, 5.5), (11.0, 5.0))]
    points = points_of(runs)
    assert len(points) == 2
    fwd, bwd = _by_pass(points)["fwd"], _by_pass(points)["bwd"]
    assert fwd.measured_ms == 11.0 and fwd.record is runs[2]  # 10, 11, 30: the stalled 30 is out
    assert bwd.measured_ms == 5.5 and bwd.record is runs[1]  # 5, 5.5, 50


def test_an_even_number_of_runs_takes_the_mean_of_the_middle_two():
    runs = [_record("ring", 2, 12.0, None), _record("ring", 2, 10.0, None)]
    (point,) = points_of(runs)
    assert point.pass_ == "fwd"
    assert point.measured_ms == pytest.approx(11.0)
    assert point.record is runs[1]  # the faster of the middle two


def test_a_run_without_the_pass_does_not_enter_its_median():
    runs = [_record("ring", 2, fwd, bwd) for fwd, bwd in ((10.0, 4.0), (20.0, None), (40.0, 8.0))]
    runs[1].pass_result("bwd").status = "oom"
    by_pass = _by_pass(points_of(runs))
    assert by_pass["fwd"].measured_ms == 20.0
    assert by_pass["bwd"].measured_ms == pytest.approx(6.0)  # 4 and 8 only


def test_different_cells_and_failed_records_stay_apart():
    failed = _record("ring", 2, 1.0, 1.0)
    failed.status = "error"
    runs = [
        _record("ring", 2, 10.0, 20.0),
        _record("ring", 4, 30.0, 60.0),
        _record("ulysses", 2, 7.0, 9.0),
        failed,
    ]
    points = points_of(runs)
    assert {(p.cell.cp, p.cell.world, p.pass_, p.measured_ms) for p in points} == {
        ("ring", 2, "fwd", 10.0),
        ("ring", 2, "bwd", 20.0),
        ("ring", 4, "fwd", 30.0),
        ("ring", 4, "bwd", 60.0),
        ("ulysses", 2, "fwd", 7.0),
        ("ulysses", 2, "bwd", 9.0),
    }
    assert all(p.replay is not None and p.single is None for p in points)
