"""``python -m lcab.main``: every ``ok`` record it writes carries the planner's prediction."""

from __future__ import annotations

import pytest

from lcab.config import resolve_cell
from lcab.plan.expected import expect_length
from lcab.plan.hardware import auto_profile, load_profile
from lcab.records.sinks import RECORDS_FILE, read_records
from tests.helpers.cli import cli_env, run_lcab

OVERRIDES = [
    "kernel=ranges",
    "mask=causal",
    "seqlen.values=[256,512]",
    "bench=quick",
    "bench.passes=[fwd,bwd,fwd_bwd]",
    "bench.check_numerics=false",
    "problem.device=cpu",
]


def test_every_ok_record_has_the_prediction_and_the_ratio(tmp_path, compose):
    done = run_lcab(*OVERRIDES, f"hydra.run.dir={tmp_path / 'run'}", env=cli_env())
    assert done.returncode == 0, done.stderr
    records = read_records(tmp_path / "run" / RECORDS_FILE)
    assert [r.seqlen for r in records] == [256, 512]
    assert all(r.status == "ok" for r in records)

    hardware = auto_profile("cpu")  # the profile the run used
    assert hardware.name == "cpu_gloo_local@auto"
    assert hardware.kernels == load_profile("cpu_gloo_local").kernels  # the rates as fitted
    cell = resolve_cell(compose(OVERRIDES))
    for record in records:
        assert record.predicted_hardware == hardware.name and record.prediction_note is None
        expected = expect_length(cell, record.seqlen, hardware).prediction
        assert expected is not None
        for name, parts in (("fwd", ["fwd"]), ("bwd", ["bwd"]), ("fwd_bwd", ["fwd", "bwd"])):
            result = record.pass_result(name)
            want = sum(expected.pass_(p).time_ms for p in parts)
            assert result.predicted_ms == pytest.approx(want, rel=1e-9)
            assert result.predicted_tflops and result.predicted_tflops > 0
            assert result.predicted_ratio == pytest.approx(want / result.ms_p50)
        flagged = any(not 0.5 <= record.pass_result(p).predicted_ratio <= 2 for p in record.passes)
        assert (record.prediction_warning is not None) == flagged
    assert "vs plan" in done.stdout
