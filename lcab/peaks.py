"""Dense peak TFLOP/s of the GPUs lcab runs on, each number cited, and a pass's share of it.

NVIDIA states tensor peaks at a clock of its own choosing (H100 SXM5: 989.4 TFLOP/s dense BF16
= 132 SMs × 4096 FLOP/clk/SM × 1830 MHz, below its 1980 MHz maximum), and a capped card runs
well below it. Throughput is proportional to the SM clock, so each stated peak is scaled to the
clock a pass was measured at; a share above ``IMPLAUSIBLE_SHARE`` means a wrong FLOP count or
timer.

Every figure is **dense** (NVIDIA's sparse figures, marked *, are halved here and say so) and
carries its source and derivation. Where NVIDIA prints no clock it is computed as figure ÷
(SMs × per-SM rate); without a citable SM count (GB200, H100 NVL, H200 NVL) a figure is not
scaled. ``float32`` is the CUDA-core figure (PyTorch's default: TF32 off); ``tf32`` the TF32
tensor figure. Standard library only (the ground layer).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

TENSOR = "tensor core"
CUDA_CORE = "CUDA core"

IMPLAUSIBLE_SHARE = 1.0
"""A measured rate above this share of the peak at its own clock is impossible: the FLOP count
or the timer is wrong (cf. the 1,937 TFLOP/s per H200 of NVIDIA/Megatron-Bridge issue #2665)."""

DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float8_e4m3fn", "float32", "tf32")
"""The dtypes the table holds, under lcab's names (``tf32``: float32 with TF32 allowed)."""

_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
}


@dataclass(frozen=True)
class Figure:
    """One dense peak as NVIDIA states it: the clock it holds at, how it was read, where."""

    tflops: float
    clock_mhz: float | None
    """The SM clock the figure is stated at; None where no SM count makes it computable."""
    derivation: str
    source: str
    unit: str = TENSOR


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: how its device names read, its SM count, its dense peaks per dtype."""

    name: str
    names: tuple[frozenset[str], ...]
    """Alternatives: a device name matches when its tokens include all tokens of one."""
    sms: int | None
    sms_source: str
    bfloat16: Figure | None
    float16: Figure | None
    float8_e4m3fn: Figure | None
    float32: Figure | None
    """CUDA-core FP32 (what fp32 attention runs on unless TF32 is allowed)."""
    tf32: Figure | None
    note: str = ""

    def figure(self, dtype: str) -> Figure | None:
        """The figure for a canonical dtype name (one of ``DTYPES``), None where there is none."""
        value: Figure | None = getattr(self, dtype)
        return value


@dataclass(frozen=True)
class Peak:
    """A device's dense peak for a dtype, at the measured clock where it could be scaled."""

    gpu: str
    dtype: str
    tflops: float
    """The peak to compare with: at ``clock_mhz``."""
    clock_mhz: float | None
    """The measured clock when scaled, else the stated clock (None: NVIDIA states none)."""
    scaled: bool
    rated_tflops: float
    rated_clock_mhz: float | None
    unit: str
    source: str
    note: str = ""


def _clock(tflops: float, sms: int, flop_per_clock_sm: int) -> float:
    """The SM clock (MHz) a printed figure implies: figure ÷ (SMs × FLOP per clock per SM)."""
    return tflops * 1e12 / (sms * flop_per_clock_sm) / 1e6


def _tokens(name: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", name.lower()))


def _names(*alternatives: str) -> tuple[frozenset[str], ...]:
    return tuple(_tokens(a) for a in alternatives)


# --- Sources ------------------------------------------------------------------------------------
_A100_WP = (
    "NVIDIA A100 Tensor Core GPU Architecture whitepaper, https://images.nvidia.com/aem-dam/"
    "en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf, table comparing "
    "V100 and A100 (SMs 108, GPU Boost Clock 1410 MHz, peak FP16/BF16 Tensor 312/624, TF32 "
    "Tensor 156/312, FP32 19.5 TFLOP/s); the A100 Tensor Core does 256 FP16 FMA per clock, "
    "4 per SM = 2048 FLOP/clk/SM"
)
_A100_DS = (
    "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
    "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf, specifications "
    "table (SXM and PCIe columns print the same 312 | 624* BF16/FP16, 156 | 312* TF32, 19.5 FP32)"
)
_H100_WP = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, https://resources.nvidia.com/"
    "en-us-tensor-core/gtc22-whitepaper-hopper, table 'Comparison of NVIDIA A100 and H100 Data "
    "Center GPUs' (SMs: SXM5 132, PCIe 114; SXM5 peak FP16/BF16 Tensor 989.4/1978.9, FP32 66.9)"
)
_H100_DS = (
    "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/"
    "nvidia-tensor-core-gpu-datasheet, 'Technical Specifications' table (* = with sparsity)"
)
_H100_PCIE = (
    "NVIDIA H100 datasheet, earlier revision with an H100 PCIe column (read in its copy at "
    "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html: FP32 51, TF32 756*, "
    "BF16/FP16 1,513*, FP8 3,026*, '* Shown with sparsity'); H100 PCIe Product Brief PB-11133-001"
)
_H200 = (
    "NVIDIA H200 Tensor Core GPU, https://www.nvidia.com/en-us/data-center/h200/, 'Technical "
    "Specifications' table (H200 SXM / H200 NVL columns; * = with sparsity)"
)
_BW = (
    "NVIDIA GB200 NVL72, https://www.nvidia.com/en-us/data-center/gb200-nvl72/, 'Individual "
    "Blackwell GPU Specifications' (GB200 NVL72 / HGX B200 columns, tensor figures with "
    "sparsity); the same tensor figures, FP32 80 (B200) and 90 (GB200): NVIDIA Blackwell "
    "Architecture Technical Brief, https://resources.nvidia.com/en-us-blackwell-architecture "
    "(Table 2 in V2.1)"
)
_BW_RATE = (
    "8192 dense FP16/BF16 FLOP/clk/SM (16384 FP8): NVIDIA/cudnn-frontend benchmark/"
    "sdpa_benchmark_training/runner.py, _get_peak_mma_tflops (4096 / 8192 FMA per clock per SM)"
)
_L40S = (
    "NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413, "
    "specifications table (BF16/FP16 362.05 | 733*, FP8 733 | 1,466*, TF32 183 | 366*, FP32 91.6)"
)
_ADA_RATE = (
    "1024 dense FP16 FLOP/clk/SM (2048 FP8): NVIDIA Ada GPU Architecture whitepaper, "
    "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf, "
    "Appendix A (RTX 4090: 128 SMs at 2520 MHz, 330.3 dense FP16 Tensor TFLOP/s)"
)
_HOPPER_RATE = "4096 dense FP16/BF16 FLOP/clk/SM: twice A100's per SM per clock (the whitepaper)"


def _ampere(name: str, names: tuple[frozenset[str], ...]) -> GpuModel:
    """A100 SXM4 and PCIe: the same 108 SMs at 1410 MHz, the same printed peaks."""
    at = f"printed; stated at the whitepaper's 1410 MHz boost clock. {_A100_DS}"
    return GpuModel(
        name=name,
        names=names,
        sms=108,
        sms_source=_A100_WP,
        bfloat16=Figure(312.0, 1410.0, "printed dense (624* sparse)", f"{_A100_WP}; {at}"),
        float16=Figure(312.0, 1410.0, "printed dense (624* sparse)", f"{_A100_WP}; {at}"),
        float8_e4m3fn=None,
        float32=Figure(19.5, 1410.0, "printed", f"{_A100_WP}; {at}", CUDA_CORE),
        tf32=Figure(156.0, 1410.0, "printed dense (312* sparse)", f"{_A100_WP}; {at}"),
    )


def _nvl(name: str, names: tuple[frozenset[str], ...], source: str, note: str) -> GpuModel:
    """H100 NVL and H200 NVL: the datasheet's per-GPU figures; no citable SM count, no clock."""
    half = "halved from the printed sparse figure"
    return GpuModel(
        name=name,
        names=names,
        sms=None,
        sms_source="no NVIDIA source states the SM count: figures are not clock-scaled",
        bfloat16=Figure(1671 / 2, None, f"{half} 1,671*", source),
        float16=Figure(1671 / 2, None, f"{half} 1,671*", source),
        float8_e4m3fn=Figure(3341 / 2, None, f"{half} 3,341*", source),
        float32=Figure(60.0, None, "printed", source, CUDA_CORE),
        tf32=Figure(835 / 2, None, f"{half} 835*", source),
        note=note,
    )


def _hopper_sxm(
    name: str, names: tuple[frozenset[str], ...], dense: tuple[float, str], source: str, sms: str
) -> GpuModel:
    """H100 SXM5 and H200 SXM: GH100 with 132 SMs; tensor figures at 1830 MHz, FP32 at 1980."""
    tflops, read = dense
    clk = _clock(tflops, 132, 4096)
    how = f"{read} = 132 SMs × 4096 FLOP/clk/SM × {clk:.0f} MHz ({_HOPPER_RATE}; max 1980 MHz)"
    return GpuModel(
        name=name,
        names=names,
        sms=132,
        sms_source=sms,
        bfloat16=Figure(tflops, clk, how, source),
        float16=Figure(tflops, clk, how, source),
        float8_e4m3fn=Figure(3958 / 2, _clock(1979.0, 132, 8192), "halved from 3,958*", source),
        float32=Figure(
            66.9,
            _clock(66.9, 132, 256),
            "66.9 (printed 67) = 132 × 256 × 1980 MHz",
            source,
            CUDA_CORE,
        ),
        tf32=Figure(989 / 2, _clock(494.5, 132, 2048), "halved from 989*", source),
    )


_B200_CLK = _clock(2250.0, 148, 8192)

KNOWN_GPUS: tuple[GpuModel, ...] = (
    # Order matters where names overlap: NVL and PCIe before SXM5 (first match wins).
    _nvl(
        "H100 NVL",
        _names("h100 nvl"),
        f"{_H100_DS} (H100 NVL column, per GPU)",
        "the 2023 datasheet printed the NVL figures for a pair of GPUs (BF16 3,958*); the "
        "current one prints them per GPU",
    ),
    GpuModel(
        name="H100 PCIe",
        names=_names("h100 pcie"),
        sms=114,
        sms_source=_H100_WP,
        bfloat16=Figure(1513 / 2, _clock(756.5, 114, 4096), "halved from 1,513*", _H100_PCIE),
        float16=Figure(1513 / 2, _clock(756.5, 114, 4096), "halved from 1,513*", _H100_PCIE),
        float8_e4m3fn=Figure(3026 / 2, _clock(1513.0, 114, 8192), "halved from 3,026*", _H100_PCIE),
        float32=Figure(51.0, _clock(51.0, 114, 256), "printed", _H100_PCIE, CUDA_CORE),
        tf32=Figure(756 / 2, _clock(378.0, 114, 2048), "halved from 756*", _H100_PCIE),
        note="tensor figures at 1620 MHz (computed), FP32 at ~1750 MHz: NVIDIA prints no clock",
    ),
    _hopper_sxm(
        "H100 SXM5",
        _names("h100 hbm3", "h100 sxm5", "h100 sxm"),
        (989.4, "the whitepaper's dense 989.4 (the datasheet's 1,979* halves to 989.5)"),
        f"{_H100_WP}; {_H100_DS}",
        f"{_H100_WP}; lcab's H100 run: 'NVIDIA H100 80GB HBM3 (132 SMs)' (lcab/kernels/README.md)",
    ),
    _nvl("H200 NVL", _names("h200 nvl"), f"{_H200} (H200 NVL column)", ""),
    _hopper_sxm(
        "H200 SXM",
        _names("h200"),
        (1979 / 2, "halved from 1,979*"),
        _H200,
        "the same GH100 configuration as H100 SXM5; lcab's H200 run: 'the same SMs and clock' "
        "as its H100 (lcab/plan/README.md)",
    ),
    GpuModel(
        name="B200",
        names=_names("b200"),
        sms=148,
        sms_source="device query 'NVIDIA B200 ... Number of SMs: 148', pytorch/ao PR #4002",
        bfloat16=Figure(2250.0, _B200_CLK, f"halved from 4.5 PF*; clock computed, {_BW_RATE}", _BW),
        float16=Figure(2250.0, _B200_CLK, f"halved from 4.5 PF*; clock computed, {_BW_RATE}", _BW),
        float8_e4m3fn=Figure(4500.0, _B200_CLK, f"halved from 9 PF*; {_BW_RATE}", _BW),
        float32=Figure(
            75.0,
            _clock(75.0, 148, 256),
            "uncertain: the GB200 NVL72 page prints 75 (= 148 × 256 × 1980 MHz), kept; the "
            "technical brief 80, which 148 SMs reach only at 2111 MHz",
            _BW,
            CUDA_CORE,
        ),
        tf32=Figure(
            1100.0, _B200_CLK, "halved from 2.2 PF* (rounded: 148 × 4096 × 1856 MHz = 1125)", _BW
        ),
        note="HGX B200 at 1,000 W; NVIDIA prints no clock: 2250 = 148 × 8192 × 1856 MHz",
    ),
    GpuModel(
        name="GB200",
        names=_names("gb200"),
        sms=None,
        sms_source="unconfirmed (third parties state 148 and 152): figures are not clock-scaled",
        bfloat16=Figure(2500.0, None, "halved from 5 PF* (per GPU)", _BW),
        float16=Figure(2500.0, None, "halved from 5 PF* (per GPU)", _BW),
        float8_e4m3fn=Figure(5000.0, None, "halved from 10 PF* (per GPU)", _BW),
        float32=Figure(
            80.0,
            None,
            "uncertain: the GB200 NVL72 page prints 80 per GPU, kept; an earlier NVL72 page "
            "(6,480 per 72 GPUs) and the technical brief 90",
            _BW,
            CUDA_CORE,
        ),
        tf32=Figure(1250.0, None, "halved from 2.5 PF* (per GPU)", _BW),
        note="GB200 NVL72 GPU at up to 1,200 W: 2.5 PF dense BF16, not HGX B200's 2.25",
    ),
    _ampere("A100 SXM4", _names("a100 sxm4", "a100 sxm")),
    _ampere("A100 PCIe", _names("a100 pcie")),
    GpuModel(
        name="L40S",
        names=_names("l40s"),
        sms=142,
        sms_source=f"{_L40S}: 568 Tensor Cores at 4 per SM (18,176 CUDA cores at 128 per SM)",
        bfloat16=Figure(362.05, _clock(362.05, 142, 1024), f"printed dense; {_ADA_RATE}", _L40S),
        float16=Figure(362.05, _clock(362.05, 142, 1024), f"printed dense; {_ADA_RATE}", _L40S),
        float8_e4m3fn=Figure(733.0, _clock(733.0, 142, 2048), f"printed dense; {_ADA_RATE}", _L40S),
        float32=Figure(
            91.6, _clock(91.6, 142, 256), "printed (= 142 × 256 × 2520 MHz)", _L40S, CUDA_CORE
        ),
        tf32=Figure(183.0, _clock(183.0, 142, 512), "printed dense", _L40S),
        note="BF16's printed dense 362.05 implies 2490 MHz, half its 733* implies 2520 MHz",
    ),
)


def canonical_dtype(dtype: str) -> str | None:
    """The lcab name of a dtype string (``bf16``, ``torch.float16``, ...), None if not one here."""
    key = dtype.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    return key if key in DTYPES else None


def lookup(device_name: str) -> GpuModel | None:
    """The GPU model a device name (torch or NVML) names; None for a GPU the table lacks.

    Names are compared as sets of lower-case alphanumeric tokens, so ``A100-SXM4-80GB`` and
    ``A100 SXM4 80GB`` read alike while ``GH200`` never reads as ``H200`` nor ``GB200`` as
    ``B200``. A bare ``NVIDIA H100`` (no form factor) is ambiguous and gives None.
    """
    tokens = _tokens(device_name)
    for gpu in KNOWN_GPUS:
        if any(alt <= tokens for alt in gpu.names):
            return gpu
    return None


def peak_tflops(device_name: str, dtype: str, sm_clock_mhz: float | None = None) -> Peak | None:
    """The dense peak for ``dtype`` on the device, scaled to ``sm_clock_mhz`` when given.

    Throughput is proportional to the SM clock, so the stated figure is scaled by
    ``sm_clock_mhz / stated clock``. None for an unknown GPU or a dtype the table lacks.
    Raises ValueError for a clock that is not positive.
    """
    gpu, canon = lookup(device_name), canonical_dtype(dtype)
    figure = None if gpu is None or canon is None else gpu.figure(canon)
    if gpu is None or canon is None or figure is None:
        return None
    if sm_clock_mhz is not None and not (math.isfinite(sm_clock_mhz) and sm_clock_mhz > 0):
        raise ValueError(f"SM clock must be a positive number of MHz, got {sm_clock_mhz!r}")
    note, clock = "", figure.clock_mhz
    if sm_clock_mhz is not None and figure.clock_mhz is not None:
        tflops, clock, scaled = figure.tflops * sm_clock_mhz / figure.clock_mhz, sm_clock_mhz, True
    else:
        tflops, scaled = figure.tflops, False
        if sm_clock_mhz is not None:
            note = f"{gpu.name}: no SM count gives this figure's clock; not scaled to the clock"
    return Peak(
        gpu=gpu.name,
        dtype=canon,
        tflops=tflops,
        clock_mhz=clock,
        scaled=scaled,
        rated_tflops=figure.tflops,
        rated_clock_mhz=figure.clock_mhz,
        unit=figure.unit,
        source=f"{figure.derivation}. {figure.source}",
        note=note,
    )


def share_of_peak(tflops: float, peak: Peak) -> float:
    """A measured rate as a share of the peak (at the measured clock when ``peak.scaled``)."""
    return tflops / peak.tflops


def is_implausible(share: float) -> bool:
    """Whether a share of the peak at the measured clock is above what the silicon can do."""
    return share > IMPLAUSIBLE_SHARE
