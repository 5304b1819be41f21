"""The GPU round's own tools, run on CPU: the harness-vs-timer cells and SDPA's kernel names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lcab.perf import gpu_timer
from tests.gpu.sdpa_choice import backend_of

ROOT = Path(__file__).resolve().parents[2]


def test_a_cell_is_timed_by_both_clocks_in_two_rounds() -> None:
    rows = gpu_timer.time_cell("ranges", "causal", 256, torch.device("cpu"), torch.float32)
    assert [r.pass_ for r in rows] == ["fwd", "bwd"]
    for row in rows:
        assert row.note == "" and row.rounds_ms is not None and len(row.rounds_ms) == 2
        assert all(a > 0 and b > 0 for a, b in row.rounds_ms)
        assert row.lcab_ms == pytest.approx(sum(a for a, _ in row.rounds_ms) / 2)
        assert row.reference_ms == pytest.approx(sum(b for _, b in row.rounds_ms) / 2)
        assert row.ratio == pytest.approx(row.lcab_ms / row.reference_ms)
        assert row.reference == "torch.utils.benchmark.Timer"


def test_a_kernel_that_cannot_run_says_why_and_is_not_timed() -> None:
    rows = gpu_timer.time_cell("fa4", "causal", 256, torch.device("cpu"), torch.float32)
    for row in rows:
        assert row.ratio is None and row.lcab_ms is None
        assert "needs a CUDA GPU" in row.note


def test_kernel_names_of_the_h100_trace_name_their_backend() -> None:
    """The kernel names the profiler recorded on the H100 (committed with the run)."""
    path = ROOT / "notebooks" / "data" / "gpu_h100_sdpa_choice.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows
    for row in rows:
        for pass_ in ("fwd", "bwd"):
            assert backend_of(row[pass_]["kernels"]) == row[pass_]["profiler"] == "CUDNN_ATTENTION"
    # names of the other backends' kernels, from PyTorch's sources (aten/src/ATen/native/
    # transformers/cuda: flash_attn's flash_fwd_kernel, mem_eff_attention's fmha_cutlassF)
    assert backend_of(["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>"]) == (
        "FLASH_ATTENTION"
    )
    assert backend_of(["fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention)"]) == (
        "EFFICIENT_ATTENTION"
    )
    assert backend_of(["ampere_bf16_s16816gemm_bf16_128x64", "softmax_warp_forward"]) == "MATH"
