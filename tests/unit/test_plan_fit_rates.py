"""The rates fit (``python launchers/plan_fit.py rates``) against known truth: times made by a
profile with planted parameters give those parameters back."""

from __future__ import annotations

import pytest

from lcab.cp import STRATEGIES
from lcab.masks import make_mask
from lcab.plan.calibrate import Point, points_of
from lcab.plan.hardware import load_profile
from lcab.plan.model import predict_pass
from lcab.plan.predict import PlanCell
from lcab.plan.replay import replay
from plan_fit import fit_rates, free_parameters


def test_calibration_recovers_the_parameters_that_generated_the_times():
    truth = load_profile("cpu_gloo_local").with_values(
        {
            "kernels.ranges.fwd_tflops": 0.03,
            "kernels.ranges.bwd_tflops": 0.012,
            "kernels.ranges.half_keys": 64.0,
            "kernels.ranges.call_us": 800.0,
            "intra.gbps": 0.9,
            "intra.latency_us": 300.0,
            "memory_gbps": 4.0,
        }
    )
    points = []
    docs = {"doc_source": "uniform", "min_doc_len": 30, "max_doc_len": 400}
    for cp in ("ulysses", "ring", "ring_allgather", "usp"):
        for world in (2, 4, 8):
            for mask_name, params in (("causal", {}), ("causal_document", docs)):
                cell = PlanCell(
                    cp,
                    "ranges",
                    mask_name,
                    256 * world,
                    1,
                    world,
                    24,
                    8,
                    32,
                    "float32",
                    mask_params=params,
                )
                strategy = STRATEGIES.get(cp)({}, world)
                mask = make_mask(mask_name, cell.seqlen, **params)
                r = replay(strategy, mask, cell.problem(), world)
                for pass_ in ("fwd", "bwd"):
                    ms = predict_pass(r, truth, "ranges", pass_).time_ms
                    points.append(Point(cell, pass_, ms, r, None))  # type: ignore[arg-type]
    start = load_profile("cpu_gloo_local")
    fit = fit_rates(points, start)
    assert fit.rms_log_error < 1e-3
    for name in free_parameters(start, ["ranges"]):
        node = truth.to_dict()
        for part in name.split("."):
            node = node[part]
        assert fit.parameters[name] == pytest.approx(node, rel=0.05), name


def test_single_device_kernel_records_fit_the_kernel_rate_alone():
    """A GPU machine's own kernel sweep (cp=none records) gives the profile's kernel numbers."""
    from lcab.flops import attention_flops
    from lcab.records.schema import PassResult, RunRecord

    truth = load_profile("h100_nvlink_ib").with_values(
        {
            "kernels.fa3.fwd_tflops": 650.0,
            "kernels.fa3.bwd_tflops": 480.0,
            "kernels.fa3.half_keys": 700.0,
            "kernels.fa3.bwd_half_keys": 300.0,
            "kernels.fa3.call_us": 12.0,
        }
    )
    records = []
    docs = {"doc_source": "uniform", "min_doc_len": 256, "max_doc_len": 8192}
    for mask_name, params in (("full", {}), ("causal", {}), ("causal_document", docs)):
        for seqlen in (2048, 8192, 32768):
            record = RunRecord(
                kernel="fa3",
                cp="none",
                mask=mask_name,
                seqlen=seqlen,
                status="ok",
                heads_q=64,
                heads_kv=8,
                head_dim=128,
                dtype="bfloat16",
                mask_seed=1,
                config={"mask": dict(params), "cp": {}},
            )
            for pass_ in ("fwd", "bwd"):
                record.pass_result(pass_).status = "ok"
                record.pass_result(pass_).ms_p50 = 1.0  # replaced by the true profile's time
            records.append(record)
    points = points_of(records)
    assert len(points) == 2 * len(records)
    for point in points:  # the measured time: what the true profile says
        mask = make_mask(point.cell.mask, point.cell.seqlen, seed=1, **point.cell.mask_params)
        assert point.single.flops == attention_flops(mask, 64, 128, point.pass_)
        result: PassResult = point.record.pass_result(point.pass_)
        result.ms_p50 = point.predicted_ms(truth)
    points = points_of(records)
    fit = fit_rates(points, load_profile("h100_nvlink_ib"))
    assert set(fit.parameters) == {
        f"kernels.fa3.{p}"
        for p in ("fwd_tflops", "bwd_tflops", "half_keys", "bwd_half_keys", "call_us")
    }
    wanted = {"fwd_tflops": 650.0, "bwd_tflops": 480.0, "half_keys": 700.0, "bwd_half_keys": 300.0}
    for name, want in wanted.items():
        assert fit.parameters[f"kernels.fa3.{name}"] == pytest.approx(want, rel=0.02), name
