"""The runner turns every kind of failure into a record status instead of raising."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from lcab.bench.runner import run_seqlen
from lcab.bench.targets import KernelTarget
from lcab.config import resolve_cell
from lcab.kernels import KernelCaps, PreparedAttention, Problem, get_kernel
from lcab.kernels.base import Kernel
from lcab.masks import AttnMask


@pytest.fixture(scope="module")
def cell(compose):
    return resolve_cell(
        compose(
            [
                "kernel=naive",
                "mask=causal",
                "seqlen=tiny",
                "bench=quick",
                "problem.device=cpu",
                "bench.passes=[fwd,bwd]",
            ]
        )
    )


class _Prepared(PreparedAttention):
    def __init__(self, behaviour: str, inner: PreparedAttention) -> None:
        self.behaviour, self.inner = behaviour, inner
        self.layout = inner.layout  # same native layout as the kernel it wraps

    def run(self, q, k, v):
        if self.behaviour == "raise":
            raise RuntimeError("kernel exploded")
        if self.behaviour == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
        out, lse = self.inner.run(q, k, v)
        if self.behaviour == "wrong":
            out = out + 0.5
        return out, lse


def fake_kernel(behaviour: str, devices=frozenset({"cpu"})) -> Kernel:
    class Fake(Kernel):
        name = f"fake_{behaviour}"
        caps = KernelCaps(
            devices=devices,
            dtypes=frozenset({"float32"}),
            lowering="dense",
            backward_devices=devices,
        )

        def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
            return _Prepared(behaviour, get_kernel("naive").prepare(mask, problem))

    return Fake()


def run(cell, kernel):
    return run_seqlen(cell, KernelTarget(kernel), cell.seqlens[0], env={})


def test_supported_kernel_is_ok_with_numerics(cell):
    record = run(cell, get_kernel("naive"))
    assert record.status == "ok"
    assert record.fwd.status == record.bwd.status == "ok"
    assert record.fwd.errors["out"] < 1e-5 and record.bwd.errors["dk"] < 1e-5
    assert record.fwd.ms_p50 > 0 and record.fwd.tflops > 0
    assert record.fwd.flops == 4 * (256 * 257 // 2) * 8 * 64
    assert record.bwd.flops == record.fwd.flops * 5 // 2
    # the timed repetitions themselves are kept: one mask sample here, so their median is p50
    assert len(record.fwd.ms_reps) == record.fwd.reps * cell.mask_samples == 3
    assert statistics.median(record.fwd.ms_reps) == pytest.approx(record.fwd.ms_p50, rel=1e-5)


def test_exception_becomes_error_record(cell):
    record = run(cell, fake_kernel("raise"))
    assert record.status == "error"
    assert record.fwd.status == "error" and "kernel exploded" in record.fwd.reason
    assert record.error_type == "RuntimeError"


def test_out_of_memory_becomes_oom_record(cell):
    record = run(cell, fake_kernel("oom"))
    assert record.status == "oom" and record.fwd.status == "oom"


def test_wrong_results_are_numerics_mismatch_with_timing_kept(cell):
    record = run(cell, fake_kernel("wrong"))
    assert record.status == "numerics_mismatch"
    assert record.fwd.status == "numerics_mismatch" and record.fwd.ms_p50 is not None
    assert "out error" in record.fwd.reason


def test_unsupported_device_is_skipped_fast_with_reasons(cell):
    start = time.perf_counter()
    record = run(cell, fake_kernel("ok", devices=frozenset({"cuda"})))
    assert time.perf_counter() - start < 1.0
    assert record.status == "skipped"
    assert record.fwd.status == "skipped" and "CUDA" in record.fwd.reason
    assert record.reasons and record.mask_area is None  # decided before building anything


def test_gpu_only_kernel_names_cuda_and_package(cell):
    record = run(cell, get_kernel("fa3"))
    assert record.status == "skipped"
    text = " ".join(record.reasons)
    assert "CUDA" in text and "flash_attn_interface" in text


def test_check_over_budget_is_skipped_with_reason_and_timings_kept(cell, monkeypatch):
    import lcab.bench.checking as checking

    monkeypatch.setattr(checking, "memory_budget", lambda device: 1 << 20)  # 1 MiB
    record = run(cell, get_kernel("naive"))
    assert record.status == "ok"
    assert record.numerics_mode == "skipped"
    assert record.fwd.errors is None and record.bwd.errors is None
    assert record.fwd.ms_p50 > 0 and record.bwd.ms_p50 > 0
    assert any("numerics check skipped" in r and "budget of 1 MiB" in r for r in record.reasons)


def test_reference_out_of_memory_keeps_the_timings(cell, monkeypatch):
    import lcab.kernels.reference as reference

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 GiB")

    # the full reference calls the registered kernel's run: make that the one that fails
    monkeypatch.setattr(reference._PreparedReference, "run", exhausted)
    record = run(cell, get_kernel("naive"))
    assert record.status == "ok"
    assert record.fwd.status == record.bwd.status == "ok"
    assert record.fwd.ms_p50 > 0 and record.bwd.ms_p50 > 0
    assert record.fwd.errors is None
    failed = [r for r in record.reasons if "numerics check failed (out of memory" in r]
    assert len(failed) == 2 and all("timings kept" in r for r in failed)
