"""GPU peak table: hand-computed peaks, clock scaling, sources, device-name matching, shares."""

from __future__ import annotations

import ast
import dataclasses
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lcab.peaks as peaks
from lcab.peaks import (
    DTYPES,
    IMPLAUSIBLE_SHARE,
    KNOWN_GPUS,
    canonical_dtype,
    is_implausible,
    lookup,
    peak_tflops,
    share_of_peak,
)

# Dense FLOP per clock per SM, from the architecture documents, independent of the table:
# Ampere: 4 Tensor Cores x 256 FP16 FMA x 2; Hopper twice Ampere; Ada (L40S, FP32 accumulate)
# 1024; Blackwell (cudnn-frontend's 4096 FMA) 8192. CUDA-core FP32: 64 (Ampere) or 128 FMA x 2.
RATES = {
    "ampere": {"bfloat16": 2048, "float16": 2048, "tf32": 1024, "float32": 128},
    "hopper": {
        "bfloat16": 4096,
        "float16": 4096,
        "float8_e4m3fn": 8192,
        "tf32": 2048,
        "float32": 256,
    },
    "ada": {"bfloat16": 1024, "float16": 1024, "float8_e4m3fn": 2048, "tf32": 512, "float32": 256},
    "blackwell": {
        "bfloat16": 8192,
        "float16": 8192,
        "float8_e4m3fn": 16384,
        "tf32": 4096,
        "float32": 256,
    },
}
ARCH = {
    "A100 SXM4": "ampere",
    "A100 PCIe": "ampere",
    "H100 SXM5": "hopper",
    "H100 PCIe": "hopper",
    "H100 NVL": "hopper",
    "H200 SXM": "hopper",
    "H200 NVL": "hopper",
    "L40S": "ada",
    "B200": "blackwell",
    "GB200": "blackwell",
}

NAMES = {
    "NVIDIA H100 80GB HBM3": "H100 SXM5",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA B200": "B200",
    "NVIDIA GB200": "GB200",
    "NVIDIA A100-SXM4-80GB": "A100 SXM4",
    "NVIDIA A100-SXM4-40GB": "A100 SXM4",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe",
    "NVIDIA A100 80GB PCIe": "A100 PCIe",
    "NVIDIA L40S": "L40S",
}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_hand_computed_peaks() -> None:
    cases = [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 132 * 4096 * 1830e6 / 1e12),  # 989.43
        ("NVIDIA H200", "bfloat16", 132 * 4096 * 1830e6 / 1e12),
        ("NVIDIA H100 PCIe", "bfloat16", 114 * 4096 * 1620e6 / 1e12),  # 756.4
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 108 * 2048 * 1410e6 / 1e12),  # 311.9
        ("NVIDIA A100 80GB PCIe", "float16", 108 * 2048 * 1410e6 / 1e12),
        ("NVIDIA A100-SXM4-40GB", "float32", 108 * 128 * 1410e6 / 1e12),  # 19.49
        ("NVIDIA H100 80GB HBM3", "float8_e4m3fn", 132 * 8192 * 1830e6 / 1e12),
        ("NVIDIA H100 80GB HBM3", "float32", 132 * 256 * 1980e6 / 1e12),  # 66.9
        ("NVIDIA B200", "bfloat16", 148 * 8192 * 1856e6 / 1e12),  # 2250.3
        ("NVIDIA L40S", "float8_e4m3fn", 142 * 2048 * 2520e6 / 1e12),  # 732.9
    ]
    for name, dtype, expected in cases:
        peak = peak_tflops(name, dtype, None)
        assert peak is not None, (name, dtype)
        assert _rel(peak.tflops, expected) < 1e-3, (name, dtype, peak.tflops, expected)
        assert not peak.scaled and peak.clock_mhz == peak.rated_clock_mhz


def test_stated_clocks() -> None:
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.bfloat16 is not None and h100.float32 is not None
    assert h100.bfloat16.clock_mhz == pytest.approx(1830, abs=1)  # not the 1980 MHz maximum
    assert h100.float32.clock_mhz == pytest.approx(1980, abs=2)  # CUDA-core rows: max clock
    pcie = lookup("NVIDIA H100 PCIe")
    assert pcie is not None and pcie.bfloat16 is not None
    assert pcie.bfloat16.clock_mhz == pytest.approx(1620, abs=1)
    a100 = lookup("NVIDIA A100-PCIE-40GB")
    assert a100 is not None and a100.bfloat16 is not None and a100.bfloat16.clock_mhz == 1410


MAX_SM_MHZ = {
    "A100 SXM4": 1410,  # the A100 whitepaper's GPU Boost Clock
    "A100 PCIe": 1410,
    "H100 SXM5": 1980,  # nvidia-smi's Max Clocks (the emulated NVML's figure, tests/helpers)
    "H100 PCIe": 1755,
    "H200 SXM": 1980,  # nvidia-smi -q on a P5e (awslabs/amazon-eks-ami PR #1985)
    "L40S": 2520,
    "B200": 1965,  # the clock public B200 benchmarks state they ran at
}
"""The highest SM clock of each card whose SM count is known, from outside lcab's table."""


def test_every_figure_implies_a_clock_its_card_reaches() -> None:
    """A figure over SMs x FLOP per clock per SM (the architecture's, above) is the clock it is
    stated at: at most the card's maximum (1 % for NVIDIA's rounding), and not far below it. A
    sparse figure left unhalved would need twice the clock."""
    checked = 0
    for gpu in KNOWN_GPUS:
        if gpu.sms is None:
            continue
        for dtype in DTYPES:
            fig = gpu.figure(dtype)
            if fig is None:
                continue
            implied = fig.tflops * 1e12 / (gpu.sms * RATES[ARCH[gpu.name]][dtype]) / 1e6
            top = MAX_SM_MHZ[gpu.name]
            assert 0.8 * top <= implied <= 1.01 * top, (gpu.name, dtype, implied, top)
            checked += 1
    assert checked >= 30


def test_blackwell_fp32_figures_are_marked_uncertain() -> None:
    """NVIDIA's pages print 75 (B200) and 80 (GB200), its technical brief 80 and 90."""
    for name in ("NVIDIA B200", "NVIDIA GB200"):
        peak = peak_tflops(name, "float32")
        assert peak is not None and "uncertain" in peak.source, name


def test_every_number_has_a_source() -> None:
    assert {g.name for g in KNOWN_GPUS} >= set(NAMES.values())
    for gpu in KNOWN_GPUS:
        assert gpu.sms_source, gpu.name
        assert gpu.bfloat16 is not None and gpu.float16 is not None and gpu.float32 is not None
        for dtype in DTYPES:
            fig = gpu.figure(dtype)
            if fig is None:
                continue
            assert "https://" in fig.source, (gpu.name, dtype)
            assert fig.derivation, (gpu.name, dtype)
            assert fig.unit == (peaks.CUDA_CORE if dtype == "float32" else peaks.TENSOR)
            assert fig.tflops > 0
            peak = peak_tflops(gpu.name, dtype)
            assert peak is not None and "https://" in peak.source


def test_device_names_map_to_their_model() -> None:
    for name, model in NAMES.items():
        gpu = lookup(name)
        assert gpu is not None and gpu.name == model, name
        assert lookup(name.lower()) == gpu and lookup(name.upper()) == gpu


@pytest.mark.parametrize(
    "name",
    ["NVIDIA GH200 480GB", "NVIDIA H20", "NVIDIA H800", "NVIDIA L40", "NVIDIA H100", "", "cpu"],
)
def test_other_devices_are_unknown(name: str) -> None:
    assert lookup(name) is None
    assert peak_tflops(name, "bfloat16", 1500.0) is None


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(NAMES)),
    sep=st.sampled_from([" ", "-", "_", "  ", "/"]),
    upper=st.booleans(),
)
def test_h100_and_h200_never_cross(name: str, sep: str, upper: bool) -> None:
    variant = sep.join(name.split())
    variant = variant.upper() if upper else variant.lower()
    gpu = lookup(variant)
    assert gpu is not None and gpu.name == NAMES[name]
    if "H100" in name:
        assert "H200" not in gpu.name
    if "H200" in name:
        assert "H100" not in gpu.name
    if "GB200" in name:
        assert gpu.name == "GB200"


def test_no_peak_for_an_unknown_gpu_or_dtype() -> None:
    assert peak_tflops("Tesla X", "bf16", 1000.0) is None
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "float8_e4m3fn", 1410.0) is None
    assert peak_tflops("NVIDIA H200", "int8") is None
    assert peak_tflops("NVIDIA H200", "bf16") is not None


def test_dtype_aliases() -> None:
    for alias, canon in [
        ("bf16", "bfloat16"),
        ("BF16", "bfloat16"),
        ("torch.bfloat16", "bfloat16"),
        ("fp16", "float16"),
        ("half", "float16"),
        ("fp32", "float32"),
        ("float32", "float32"),
        ("fp8", "float8_e4m3fn"),
        ("float8_e4m3fn", "float8_e4m3fn"),
        ("tf32", "tf32"),
    ]:
        assert canonical_dtype(alias) == canon
    assert canonical_dtype("float8_e5m2") is None
    fp32, tf32 = peak_tflops("NVIDIA H200", "fp32"), peak_tflops("NVIDIA H200", "tf32")
    assert fp32 is not None and tf32 is not None
    assert fp32.unit == peaks.CUDA_CORE and fp32.rated_tflops == pytest.approx(66.9)
    assert tf32.unit == peaks.TENSOR and tf32.rated_tflops == pytest.approx(494.5)


def test_half_the_stated_clock_halves_the_peak() -> None:
    for name in NAMES:
        for dtype in DTYPES:
            rated = peak_tflops(name, dtype)
            if rated is None or rated.rated_clock_mhz is None:
                continue
            half = peak_tflops(name, dtype, rated.rated_clock_mhz / 2)
            assert half is not None and half.scaled
            assert half.tflops == pytest.approx(rated.tflops / 2, rel=1e-12)
            assert half.clock_mhz == pytest.approx(rated.rated_clock_mhz / 2)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA B200"]),
    dtype=st.sampled_from(["bfloat16", "float16", "float32", "tf32"]),
    c1=st.floats(min_value=100.0, max_value=3000.0),
    c2=st.floats(min_value=100.0, max_value=3000.0),
)
def test_scaling_is_linear_and_monotonic(name: str, dtype: str, c1: float, c2: float) -> None:
    p1, p2 = peak_tflops(name, dtype, c1), peak_tflops(name, dtype, c2)
    assert p1 is not None and p2 is not None and p1.scaled and p2.scaled
    assert p1.tflops / c1 == pytest.approx(p2.tflops / c2, rel=1e-12)  # linear through zero
    if c1 < c2:
        assert p1.tflops < p2.tflops
    assert p1.rated_tflops == p2.rated_tflops


def test_no_citable_clock_is_not_scaled() -> None:
    for name in ["NVIDIA GB200", "NVIDIA H100 NVL", "NVIDIA H200 NVL"]:
        peak = peak_tflops(name, "bf16", 1500.0)
        assert peak is not None and not peak.scaled
        assert peak.tflops == peak.rated_tflops and peak.clock_mhz is None and peak.note


@pytest.mark.parametrize("clock", [0.0, -1.0, math.nan, math.inf])
def test_a_bad_clock_is_refused(clock: float) -> None:
    with pytest.raises(ValueError, match="SM clock"):
        peak_tflops("NVIDIA H200", "bf16", clock)


def test_share_above_the_peak_is_implausible() -> None:
    # Megatron-Bridge #2665: 1,937 TFLOP/s per H200 (bf16), even at its 1980 MHz maximum clock.
    peak = peak_tflops("NVIDIA H200", "bf16", 1980.0)
    assert peak is not None
    assert peak.tflops == pytest.approx(989.5 * 1980 / 1830, rel=1e-3)
    share = share_of_peak(1937.0, peak)
    assert share > 1.8 and is_implausible(share)
    assert not is_implausible(share_of_peak(700.0, peak))
    assert IMPLAUSIBLE_SHARE == 1.0
    assert not is_implausible(1.0) and is_implausible(1.0 + 1e-9)
    # The same rate at a lower measured clock is a larger share: the clock matters.
    slow = peak_tflops("NVIDIA H200", "bf16", 1400.0)
    assert slow is not None and share_of_peak(700.0, slow) > share_of_peak(700.0, peak)


def test_results_are_frozen() -> None:
    peak = peak_tflops("NVIDIA H200", "bf16", 1700.0)
    gpu = lookup("NVIDIA H200")
    assert peak is not None and gpu is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        peak.tflops = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.sms = 1  # type: ignore[misc]


def test_ground_layer_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(peaks.__file__).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots and roots <= set(sys.stdlib_module_names) | {"__future__"}
