"""Every record carries the planner's prediction; a cell far from it is flagged.

The flagging test times a stand-in kernel whose passes sleep: a sleep sets a pass's time
without using the CPU, so the measured times, and so the ratios, hold on a loaded machine. The
profile is a hand-made one (`tests.helpers.plan_hardware`) whose predicted times are set to
tens of milliseconds, and the sleeps are taken from the planner's own prediction.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lcab.bench.runner import run_seqlen
from lcab.bench.targets import KernelTarget
from lcab.config import resolve_cell
from lcab.plan.expected import expect_length
from lcab.plan.hardware import KernelRate
from lcab.plan.record_prediction import BAND, attach, record_predictor
from lcab.records.schema import RunRecord
from tests.helpers.plan_hardware import hand_hardware
from tests.helpers.standin_sleep import sleeping_kernel

# 2 GFLOP/s forward, 4 backward: the tiny cell's passes are predicted at ~34 and ~42 ms
SLOW_HW = hand_hardware(kernels={"default": KernelRate(0.002, 0.004, 1e-9, 0.0)})


@pytest.fixture(scope="module")
def cell(compose):
    return resolve_cell(
        compose(
            [
                "kernel=naive",  # replaced by the stand-in; its config only shapes the cell
                "mask=causal",
                "seqlen.values=[256]",
                "bench=quick",
                "problem.device=cpu",
                "bench.passes=[fwd,bwd]",
                "bench.check_numerics=false",
            ]
        )
    )


def _run(cell, fwd_s: float, bwd_s: float) -> RunRecord:
    record = run_seqlen(cell, KernelTarget(sleeping_kernel(fwd_s, bwd_s)), 256, env={})
    record_predictor({"hardware": SLOW_HW.to_dict()}, cell)(record)
    return record


def test_slowed_cell_is_flagged_and_a_normal_one_is_not(cell) -> None:
    predicted = expect_length(cell, 256, SLOW_HW).prediction
    assert predicted is not None
    fwd_s, bwd_s = predicted.fwd.time_ms / 1e3, predicted.bwd.time_ms / 1e3
    assert 0.02 < fwd_s < 0.1 and 0.02 < bwd_s < 0.1

    normal = _run(cell, fwd_s, bwd_s)
    assert normal.status == "ok" and normal.prediction_warning is None
    assert normal.predicted_hardware == "hand"
    for result, expected_ms in ((normal.fwd, predicted.fwd.time_ms), (normal.bwd, bwd_s * 1e3)):
        assert result.predicted_ms == pytest.approx(expected_ms)
        # measured >= the sleep, and the stand-in adds little else: ratio just under 1
        assert result.predicted_ratio == pytest.approx(result.predicted_ms / result.ms_p50)
        assert BAND[0] < result.predicted_ratio <= 1.02

    slowed = _run(cell, 10 * fwd_s, bwd_s)  # the forward sleeps 10x its prediction
    assert slowed.status == "ok"
    assert slowed.fwd.predicted_ratio < 0.11
    assert BAND[0] < slowed.bwd.predicted_ratio <= 1.02
    assert slowed.prediction_warning is not None
    assert slowed.prediction_warning.startswith("off the plan: fwd 0.")
    assert "bwd" not in slowed.prediction_warning
    assert "[0.5, 2]" in slowed.prediction_warning and "hand" in slowed.prediction_warning


def _pass(ms: float, tflops: float) -> SimpleNamespace:
    return SimpleNamespace(time_ms=ms, tflops=tflops)


def test_fwd_bwd_is_the_sum_of_the_predicted_passes_and_ratios_are_times() -> None:
    prediction = SimpleNamespace(fwd=_pass(10.0, 3.0), bwd=_pass(30.0, 2.0))
    prediction.pass_ = lambda name: prediction.fwd if name == "fwd" else prediction.bwd
    record = RunRecord(status="ok", passes=["fwd", "fwd_bwd"], predicted_hardware="hw")
    record.fwd.status, record.fwd.ms_p50 = "ok", 25.0  # 0.4x: flagged
    record.fwd_bwd.status, record.fwd_bwd.ms_p50 = "ok", 40.0  # 1.0x
    attach(record, prediction)
    assert record.fwd.predicted_ms == 10.0 and record.fwd.predicted_tflops == 3.0
    assert record.fwd.predicted_ratio == pytest.approx(0.4)
    assert record.fwd_bwd.predicted_ms == 40.0
    # time-weighted: (3 x 10 + 2 x 30) / 40 FLOP per ms
    assert record.fwd_bwd.predicted_tflops == pytest.approx(90 / 40)
    assert record.fwd_bwd.predicted_ratio == pytest.approx(1.0)
    assert record.prediction_warning is not None and "fwd 0.4x" in record.prediction_warning
    assert "fwd_bwd" not in record.prediction_warning
    assert record.bwd.predicted_ms is None  # not a requested pass


def test_no_warning_for_a_failed_record_or_pass() -> None:
    prediction = SimpleNamespace(fwd=_pass(10.0, 3.0), bwd=_pass(30.0, 2.0))
    prediction.pass_ = lambda name: prediction.fwd if name == "fwd" else prediction.bwd
    record = RunRecord(status="timeout", passes=["fwd"])
    record.fwd.status = "timeout"
    attach(record, prediction)
    assert record.fwd.predicted_ms == 10.0  # what it was expected to take
    assert record.fwd.predicted_ratio is None and record.prediction_warning is None


def test_a_prediction_that_fails_is_a_note_never_an_error(cell) -> None:
    broken = record_predictor({"hardware": {"name": "broken"}}, cell)
    record = RunRecord(status="ok", seqlen=256, passes=["fwd"])
    broken(record)
    assert record.prediction_note and record.prediction_note.startswith("no prediction: ")
    assert record.fwd.predicted_ms is None and record.prediction_warning is None


def test_a_cell_the_strategy_cannot_run_says_why(compose) -> None:
    # Ulysses splits heads: 3 heads over 2 ranks is refused by the strategy
    bad = resolve_cell(
        compose(["kernel=ranges", "cp=ulysses", "topology=local2", "seqlen.values=[256]"])
    ).with_seqlens([256])
    odd = bad.__class__(**{**bad.__dict__, "heads_kv": 3, "heads_q": 3})
    annotate = record_predictor({"hardware": SLOW_HW.to_dict()}, odd)
    record = RunRecord(status="skipped", seqlen=256, passes=["fwd"])
    annotate(record)
    assert record.predicted_hardware == "hand"
    assert record.prediction_note == (
        "no prediction: heads_q=3 is not divisible by the Ulysses degree 2"
    )
    assert record.fwd.predicted_ms is None
