"""A profile's kernel rates fitted to public single-GPU figures, reproducibly.

The planner's H100 profile must not be fitted to the context-parallel table it is checked
against, so its kernel rates come from single-GPU charts. Which charts, and how they become a
plateau and a saturation length, is data (``lcab/plan/figures/<profile>.yaml``) plus this fit,
so anyone can re-derive the shipped numbers (`python -m lcab.plan.kernel_figures`) and a test
holds the profile to them.

Each figure is costed as the planner costs a kernel call (`lcab.plan.model.CostModel`), so the
fitted numbers mean what the planner uses them for. A kernel's build changes its plateau more
than its saturation length, so the reference source sets the plateaus, every other source gets
one free scale per kernel and pass, and the saturation lengths are fitted to all of them (the
FlashAttention-3 paper's 512-token backward pins what the blog's 8K and 32K points cannot).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lcab.masks import make_mask
from lcab.plan.calibrate import start_value, whole_mask_call
from lcab.plan.hardware import Hardware, KernelRate, load_profile
from lcab.plan.model import CostModel
from lcab.plan.steps import Work
from lcab.records.published import published

FIGURES_DIR = Path(__file__).resolve().parent / "figures"
PARAMETERS = {"fwd": ("fwd_tflops", "half_keys"), "bwd": ("bwd_tflops", "bwd_half_keys")}
"""Per pass: the plateau and the sweep length of half saturation. ``call_us`` is fitted too."""
BIAS = {"fwd": "bias_bytes", "bwd": "bwd_bias_bytes"}
"""Per pass: a dense-mask kernel's bias traffic per computed position."""


@dataclass(frozen=True)
class Figure:
    """One published throughput: a kernel, a mask, a length, a pass."""

    source: str
    kernel: str
    mask: str
    pass_: str
    seqlen: int
    tflops: float
    heads_q: int
    heads_kv: int
    batch: int = 1
    head_dim: int = 128
    params: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """Short name for tables."""
        batch = f"{self.batch}x" if self.batch > 1 else ""
        return f"{self.source} {self.mask} {self.pass_} {batch}{self.seqlen}"


@dataclass(frozen=True)
class Figures:
    """A figures file: the reference source, where the ``default`` kernel comes from, sources."""

    reference: str
    default_from: str | None
    sources: dict[str, Any]
    """Source name -> its citation, or ``{published: ID}`` (`lcab.records.published`)."""
    figures: list[Figure]
    saturation_from: dict[str, str] = field(default_factory=dict)
    """Kernels whose figures cannot place a saturation length (two long lengths, no short
    sweep), and the kernel whose fitted lengths they take: only their plateaus are fitted."""

    def kernels(self) -> list[str]:
        """Kernels with figures, in file order."""
        return list(dict.fromkeys(f.kernel for f in self.figures))


def load_figures(path: str | Path) -> Figures:
    """Read a figures file (see ``lcab/plan/figures/h100_nvlink_ib.yaml`` for the layout).

    A series of a ``{published: ID}`` source takes its points from `lcab.records.published`.

    Raises:
        ValueError: a series whose lengths and values differ in number, an unknown source, or
            a length the published source has not exactly one figure for.

    """
    data = yaml.safe_load(Path(path).read_text())
    sources = dict(data["sources"])
    figures = []
    for series in data["series"]:
        source = sources.get(series["source"])
        if source is None:
            raise ValueError(f"source={series['source']!r} is not listed; valid: {list(sources)}")
        kernel, mask, pass_ = series["kernel"], series["mask"], series["pass"]
        if isinstance(source, dict):
            store = published(source["published"])
            for seqlen in series["seqlen"]:
                found = [
                    p
                    for p in store
                    if kernel in p.kernels and (p.mask, p.pass_, p.seqlen) == (mask, pass_, seqlen)
                ]
                if len(found) != 1:
                    raise ValueError(f"{len(found)} published figures for {series} at {seqlen}")
                p = found[0]
                figures.append(
                    Figure(
                        series["source"],
                        kernel,
                        mask,
                        pass_,
                        seqlen,
                        p.value,
                        p.heads_q,
                        p.heads_kv,
                        p.batch,
                        p.head_dim,
                        dict(p.mask_params),
                    )
                )
            continue
        if len(series["seqlen"]) != len(series["tflops"]):
            raise ValueError(
                f"series {series} has {len(series['seqlen'])} lengths, "
                f"{len(series['tflops'])} values"
            )
        heads_q, heads_kv = series["heads"]
        for seqlen, tflops in zip(series["seqlen"], series["tflops"], strict=True):
            figures.append(
                Figure(
                    series["source"],
                    kernel,
                    mask,
                    pass_,
                    int(seqlen),
                    float(tflops),
                    int(heads_q),
                    int(heads_kv),
                    params=dict(series.get("params") or {}),
                )
            )
    saturation_from = dict(data.get("saturation_from") or {})
    return Figures(data["reference"], data.get("default_from"), sources, figures, saturation_from)


def figure_work(figure: Figure, rate: KernelRate) -> Work:
    """The call a figure timed, described as the planner describes a call.

    That is `lcab.plan.calibrate.whole_mask_call`, times the figure's batch, with tile padding
    exact (a figure's sequences are whole runs of known length; a backward figure's length
    whole key tiles).

    Raises:
        ValueError: a mask whose active rows are not one run per sequence, or a backward
            figure whose length is not whole key tiles.

    """
    mask = make_mask(figure.mask, figure.seqlen, **figure.params)
    call = whole_mask_call(mask, figure.heads_q, figure.heads_kv, figure.head_dim)
    dense = rate.dense_mask and call.dense_rows > 0  # the model costs the whole rectangle
    if call.runs != 1.0 and not dense:
        raise ValueError(f"figure mask {figure.mask!r} is not one run of rows per sequence")
    bwd = figure.pass_ == "bwd"
    if bwd and rate.bwd_block_cols and figure.seqlen % rate.bwd_block_cols:
        raise ValueError(
            f"backward figure seqlen={figure.seqlen} is not a multiple of the key tile "
            f"({rate.bwd_block_cols:g} columns): its padding would not be exact"
        )
    tile = rate.tile_tokens(bwd, call.q_per_kv)
    padding = math.ceil(call.rows / tile) * tile - call.rows if tile > 0 else 0.0
    return dataclasses.replace(
        call,
        flops=call.flops * (2.5 if bwd else 1.0) * figure.batch,
        runs=padding / ((tile - 1) / 2) if tile > 1 else 0.0,
        q_elements=call.q_elements * figure.batch,
        kv_elements=call.kv_elements * figure.batch,
        q_row_elements=0.0,
        kv_row_elements=0.0,
        key_columns=0.0,  # whole key tiles: no key padding (checked above)
        dense_rows=call.dense_rows * figure.batch,  # the batch's rectangles, stacked
    )


def predicted_tflops(figure: Figure, hardware: Hardware, work: Work | None = None) -> float:
    """The throughput the profile gives the figure's call (``work``: its `figure_work`, reused)."""
    work = work or figure_work(figure, hardware.rate(figure.kernel))
    model = CostModel(hardware, figure.kernel, 1, alone=True)
    seconds = model.compute_s(work, figure.pass_ == "bwd")
    return work.flops / seconds / 1e12


@dataclass(frozen=True)
class KernelFit:
    """One kernel's fitted rate, the other sources' scales, and every figure's fitted value."""

    kernel: str
    values: dict[str, float]
    """Fitted ``kernels.<kernel>.<parameter>`` values."""
    scales: dict[tuple[str, str], float]
    """(source, pass) → that source's speed relative to the reference."""
    rows: list[tuple[Figure, float]]
    """Every figure with the fitted throughput (scaled to its source)."""

    def rms_log_error(self) -> float:
        """Root-mean-square log ratio fitted / published."""
        return float(np.sqrt(np.mean([math.log(p / f.tflops) ** 2 for f, p in self.rows])))


def fit_kernel(figures: Figures, hardware: Hardware, kernel: str) -> KernelFit:
    """Fit ``kernel``'s plateau and saturation length, per pass, to its figures.

    The reference source sets the plateaus; a kernel it has no figures of is set by its first
    source (lcab's own GPU records). A kernel in ``figures.saturation_from`` keeps the other
    kernel's saturation lengths, as ``hardware`` has them. A dense-mask kernel
    (`KernelRate.dense_mask`) with figures on other masks than full and causal fits its bias
    traffic per position too.

    Raises:
        ValueError: the kernel has no figures.

    """
    from scipy.optimize import least_squares  # only fits need scipy

    mine = [f for f in figures.figures if f.kernel == kernel]
    if not mine:
        raise ValueError(f"kernel {kernel!r} has no figures")
    sources = {f.source for f in mine}
    reference = figures.reference if figures.reference in sources else mine[0].source
    passes = sorted({f.pass_ for f in mine if f.source == reference})
    mine = [f for f in mine if f.pass_ in passes]
    base = hardware if kernel in hardware.kernels else _with_kernel(hardware, kernel)
    borrowed = figures.saturation_from.get(kernel)
    if borrowed is not None:
        lengths = hardware.rate(borrowed)
        rate = dataclasses.replace(
            base.rate(kernel), half_keys=lengths.half_keys, bwd_half_keys=lengths.bwd_half_keys
        )
        base = dataclasses.replace(base, kernels={**base.kernels, kernel: rate})
    works = [figure_work(f, base.rate(kernel)) for f in mine]  # built once, not per iteration
    free = [PARAMETERS[p][0] if borrowed else PARAMETERS[p] for p in passes]
    parameters = [p for group in free for p in ((group,) if isinstance(group, str) else group)]
    if base.rate(kernel).dense_mask:
        dense = {f.pass_ for f, w in zip(mine, works, strict=True) if w.dense_rows > 0}
        parameters += [BIAS[p] for p in passes if p in dense]
    names = [f"kernels.{kernel}.{p}" for p in parameters] + [f"kernels.{kernel}.call_us"]
    scaled = sorted({(f.source, f.pass_) for f in mine if f.source != reference})
    start = np.log([start_value(base, n) for n in names] + [1.0] * len(scaled))
    measured = np.log([f.tflops for f in mine])

    def fitted(x: np.ndarray) -> np.ndarray:
        hw = base.with_values(dict(zip(names, np.exp(x[: len(names)]).tolist(), strict=True)))
        scale = dict(zip(scaled, np.exp(x[len(names) :]).tolist(), strict=True))
        return np.array(
            [
                predicted_tflops(f, hw, w) * scale.get((f.source, f.pass_), 1.0)
                for f, w in zip(mine, works, strict=True)
            ]
        )

    result = least_squares(
        lambda x: np.log(fitted(x)) - measured,
        start,
        bounds=(start - 8.0, start + 8.0),
        xtol=1e-12,
        ftol=1e-12,
        gtol=1e-12,
    )
    values = dict(zip(names, np.exp(result.x[: len(names)]).tolist(), strict=True))
    scales = dict(zip(scaled, np.exp(result.x[len(names) :]).tolist(), strict=True))
    return KernelFit(
        kernel, values, scales, list(zip(mine, fitted(result.x).tolist(), strict=True))
    )


def _with_kernel(hardware: Hardware, kernel: str) -> Hardware:
    """``hardware`` with ``kernel`` starting from the profile's ``default`` rate."""
    kernels = dict(hardware.kernels)
    kernels[kernel] = hardware.rate(kernel)
    return dataclasses.replace(hardware, kernels=kernels)


def fit_profile(figures: Figures, hardware: Hardware) -> tuple[Hardware, list[KernelFit]]:
    """``hardware`` with every kernel that has figures refitted, and the fits.

    The ``default`` kernel, where the profile has one, becomes ``figures.default_from``'s rate.
    """
    fits = []
    for kernel in figures.kernels():  # in file order: a borrowed saturation is fitted first
        fit = fit_kernel(figures, hardware, kernel)
        rate = hardware.kernels.get(kernel, hardware.rate(kernel))
        borrowed = figures.saturation_from.get(kernel)
        changes: dict[str, Any] = {n.rsplit(".", 1)[1]: v for n, v in fit.values.items()}
        if borrowed is not None:
            lengths = hardware.rate(borrowed)
            changes |= {"half_keys": lengths.half_keys, "bwd_half_keys": lengths.bwd_half_keys}
        kernels = {**hardware.kernels, kernel: dataclasses.replace(rate, **changes)}
        hardware = dataclasses.replace(hardware, kernels=kernels)
        fits.append(fit)
    if figures.default_from and "default" in hardware.kernels:
        kernels = {**hardware.kernels, "default": hardware.kernels[figures.default_from]}
        hardware = dataclasses.replace(hardware, kernels=kernels)
    return hardware, fits


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lcab.plan.kernel_figures``: fit and print, beside the shipped profile."""
    parser = argparse.ArgumentParser(
        prog="python -m lcab.plan.kernel_figures",
        description="Fit a hardware profile's kernel rates to public single-GPU figures.",
    )
    parser.add_argument(
        "--hardware",
        default="h100_nvlink_ib",
        help="profile name or YAML path (default h100_nvlink_ib)",
    )
    parser.add_argument(
        "--figures", default=None, help="figures YAML (default lcab/plan/figures/<profile>.yaml)"
    )
    args = parser.parse_args(argv)
    try:
        hardware = load_profile(args.hardware)
        path = Path(args.figures) if args.figures else FIGURES_DIR / f"{hardware.name}.yaml"
        if not path.exists():
            raise ValueError(f"--figures {str(path)!r} does not exist")
        _, fits = fit_profile(load_figures(path), hardware)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        _print_fits(fits, hardware)
    except BrokenPipeError:  # the reader stopped early (`| head`): end quietly, as pipes expect
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _print_fits(fits: Sequence[KernelFit], hardware: Hardware) -> None:
    """Each kernel's fitted values beside the profile's, then each figure beside its fit."""
    for fit in fits:
        print(f"\n{fit.kernel}: rms log error {fit.rms_log_error():.3f}")
        for name, value in fit.values.items():
            parameter = name.rsplit(".", 1)[1]
            shipped = getattr(hardware.kernels.get(fit.kernel), parameter, None)
            print(f"  {parameter:>14} {value:8.1f}   (profile: {shipped})")
        for (source, pass_), scale in fit.scales.items():
            print(f"  {source} {pass_} runs at {scale:.3f} x the reference")
        for figure, value in fit.rows:
            miss = value / figure.tflops - 1
            print(f"    {figure.label():<40} {figure.tflops:6.0f} -> {value:6.0f} ({miss:+.1%})")


if __name__ == "__main__":
    raise SystemExit(main())
