"""Each GPU kernel is costed at its own rate, or says whose it borrows; dense masks cost S².

An H100 dry run priced FA4 and PyTorch's cuDNN backend alike (649 / 524 on causal 8K), and
predicted `sdpa_cudnn` on causal_document 32K at 593 / 389 TFLOP/s where the H100 measured 52 /
46: that backend takes any mask but full and causal as a dense bias and computes every position.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lcab.launch.dry_run import print_plan
from lcab.masks import make_mask
from lcab.plan.calibrate import whole_mask_call
from lcab.plan.expected import expect_configured_job
from lcab.plan.hardware import KernelRate, load_profile
from lcab.plan.model import CostModel
from lcab.plan.steps import dense_rectangle
from tests.helpers.plan_hardware import hand_hardware

RECORDS = Path(__file__).resolve().parents[2] / "notebooks/data/gpu_h100_sweep_records.jsonl"


def test_only_a_call_that_is_neither_full_nor_causal_needs_a_dense_mask():
    assert dense_rectangle(100.0 * 100.0, 100, 100) == (0.0, 0.0)  # full
    assert dense_rectangle(100 * 101 / 2, 100, 100) == (0.0, 0.0)  # causal, diagonal included
    assert dense_rectangle(100 * 99 / 2, 100, 100) == (100, 100)  # strictly below: a bias
    assert dense_rectangle(50.0 * 100.0, 100, 100) == (100, 100)  # half the keys
    assert dense_rectangle(50.0 * 80.0, 50, 80) == (0.0, 0.0)  # a full rectangle


def test_a_dense_mask_kernel_computes_the_whole_square_and_reads_its_bias():
    """By hand: S² positions per head at the plateau, plus bias_bytes each at memory speed."""
    dense = KernelRate(1.0, 0.5, 1e-9, 0.0, dense_mask=True, bias_bytes=2.0, bwd_bias_bytes=6.0)
    hw = hand_hardware(kernels={"default": dense}, memory_gbps=1000.0)
    seqlen, heads, dim = 4096, 4, 64
    mask = make_mask("causal_document", seqlen, doc_lengths=[1024, 3072])
    call = whole_mask_call(mask, heads, heads, dim)
    assert (call.dense_rows, call.dense_keys) == (seqlen, seqlen)
    positions = seqlen * seqlen * heads
    model = CostModel(hw, "dense", 1)
    fwd = positions * 4 * dim / 1e12 + positions * 2.0 / 1000e9
    assert model.compute_s(call, False) == pytest.approx(fwd, rel=1e-6)
    bwd_call = dataclasses.replace(call, flops=call.flops * 2.5)
    bwd = positions * 10 * dim / 0.5e12 + positions * 6.0 / 1000e9
    assert model.compute_s(bwd_call, True) == pytest.approx(bwd, rel=1e-6)
    # the same kernel on a causal mask runs without one: its area, no bias
    causal = whole_mask_call(make_mask("causal", seqlen), heads, heads, dim)
    plain = CostModel(hand_hardware(), "k", 1)
    assert model.compute_s(causal, False) == pytest.approx(plain.compute_s(causal, False))
    # and a kernel without the flag costs the document mask by its area
    assert plain.compute_s(call, False) == pytest.approx(call.flops / 1e12, rel=1e-6)


def test_sdpa_cudnn_on_documents_is_predicted_near_what_the_h100_measured():
    """The records the fit used, read back through the planner's own prediction path."""
    records = [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]
    hw = load_profile("h100_nvlink_ib")
    checked = 0
    for r in records:
        if r["kernel"] != "sdpa_cudnn" or r["mask"] != "causal_document":
            continue
        mask = make_mask(r["mask"], r["seqlen"], seed=r["mask_seed"])
        assert list(mask.doc_lengths) == r["doc_lengths"]
        call = whole_mask_call(mask, r["heads_q"], r["heads_kv"], r["head_dim"])
        model = CostModel(hw, "sdpa_cudnn", 1, alone=True)
        for pass_, factor in (("fwd", 1.0), ("bwd", 2.5)):
            work = dataclasses.replace(call, flops=call.flops * factor)
            predicted = work.flops / model.compute_s(work, pass_ == "bwd") / 1e12
            assert predicted == pytest.approx(r[pass_]["tflops"], rel=0.10), (r["seqlen"], pass_)
            checked += 1
    assert checked == 4


def test_kernels_get_their_own_rate_a_borrowed_one_or_the_default_and_say_which():
    hw = load_profile("h100_nvlink_ib")
    assert hw.rate("fa4") is hw.kernels["fa4"] and hw.rate_origin("fa4") is None
    assert hw.rate("fa4").fwd_tflops > hw.rate("sdpa_cudnn").fwd_tflops  # no longer one rate
    assert hw.rate("sdpa_flash") is hw.kernels["fa2"]
    assert (
        hw.rate_origin("sdpa_flash") == "sdpa_flash is costed at fa2's rate (it runs fa2's kernels)"
    )
    assert hw.rate("flashmask") is hw.kernels["default"]
    assert "profile's default (fa3's rate)" in (hw.rate_origin("flashmask") or "")
    assert hw.with_values({"kernels.fa4.fwd_tflops": 1.0}).borrow == hw.borrow  # kept on copies


def test_the_dry_run_says_which_kernel_borrows_a_rate(capsys):
    gpu = ["problem.device=cuda", "seqlen.values=[8192]", "bench=quick", "mask=causal"]
    assert print_plan([*gpu, "kernel=fa4,flashmask,sdpa_flash"], True, expect_configured_job) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "[1] flashmask has no figures in hardware profile h100_nvlink_ib" in out
    assert "[2] sdpa_flash is costed at fa2's rate" in out
    assert "fa4 has no" not in out and "fa4 is costed" not in out
