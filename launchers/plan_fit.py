"""Fit a planner profile to measured records: its rates, or its kernels' memory terms.

    python launchers/plan_fit.py rates RECORDS [--hardware NAME|FILE] [--where KEY=V1,V2]
                                 [--set KEY=NUMBER] [--kernels-only] [--out FILE]
    python launchers/plan_fit.py memory FRONTIER_RECORDS [--hardware ...] [--where ...] [--out FILE]

A lab tool, not part of the package: a profile in ``conf/hardware/`` keeps what it fitted, and
each fitted key's ``sources:`` line names the command line that fitted it. Both fits read the
records and the profile as ``python -m lcab.plan --check`` and ``--check-memory`` do
(`lcab.plan.cli`), on the same points (`lcab.plan.calibrate.points_of`,
`lcab.plan.frontier.frontier_points`); both print a table of what they fitted and write the
profile with it to ``--out`` (else print its YAML). Bad input exits with code 2.

**rates**: the profile's free parameters (per kernel the forward / backward plateau,
half-saturation lengths and call cost; with context-parallel records the intra-node link's
bandwidth and latency and the memory bandwidth; ``--kernels-only`` holds the links) fitted in
log space with `scipy.optimize.least_squares` on the log ratio predicted / measured, so a 2×
miss weighs the same on a 1 ms and a 1 s cell.

**memory**: a frontier record (``seqlen=frontier``) says that at its budget the cell ran at
``frontier_bracket[0]`` tokens and ran out of memory at ``frontier_bracket[1]``; the fit takes
the middle of the bracket as where the fullest rank holds the budget and solves, per kernel,
for the terms of `lcab.plan.hardware.KernelMemory` (non-negative least squares over the
kernel's single-device records), then for its ``cp_fixed_mib`` and ``cp_q_bytes`` by least
squares on what its context-parallel records leave over (only the fixed part where those were
all measured at one budget), then for the profile's ``memory_margin``: the least share of the
budget to hold back so that the model's frontier would have run in `SAFE_SHARE` of the cells.
Fitting and checking on the same records shows how well the terms can fit, nothing more: fit at
one budget and check at another (``--where frontier_budget_gib=0.3,0.4``, then the 0.2 records).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from rich.table import Table

from lcab.plan.calibrate import Point, points_of, start_value
from lcab.plan.cli import print_frontier_checks, profile_for, record_options, records_for
from lcab.plan.frontier import FrontierPoint, check_memory, frontier_points, rank_memory_terms
from lcab.plan.hardware import Hardware, KernelMemory, Link
from lcab.records.table import console

SAFE_SHARE = 0.95
"""Share of the fit's cells whose measured frontier the planner's must not exceed."""


@dataclass(frozen=True)
class Fit:
    """A fitted profile, its fitted values (dotted names), and the keys whose source it is."""

    hardware: Hardware
    parameters: dict[str, float]
    points: str
    """What it was fitted on, for the table's title and the sources (e.g. "120 measured passes")."""
    sources: tuple[str, ...]
    rms_log_error: float | None = None


def free_parameters(hardware: Hardware, kernels: Iterable[str], links: bool = True) -> list[str]:
    """Dotted names of the parameters a rates fit may change for these kernels (and the links)."""
    names = []
    for kernel in sorted({k if k in hardware.kernels else "default" for k in kernels}):
        names += [
            f"kernels.{kernel}.{p}"
            for p in ("fwd_tflops", "bwd_tflops", "half_keys", "bwd_half_keys", "call_us")
        ]
    if links:
        names += ["intra.gbps", "intra.latency_us", "memory_gbps"]
    return names


def fit_rates(points: list[Point], hardware: Hardware, names: list[str] | None = None) -> Fit:
    """Fit ``names`` (default `free_parameters`) of ``hardware`` to ``points``.

    Raises:
        ValueError: no points to fit.

    """
    from scipy.optimize import least_squares

    if not points:
        raise ValueError("no ok records (kernel runs or context-parallel cells) to fit on")
    has_cp = any(p.replay is not None for p in points)
    names = names or free_parameters(hardware, {p.cell.kernel for p in points}, links=has_cp)
    start = np.log([start_value(hardware, n) for n in names])
    measured = np.log([p.measured_ms for p in points])

    def residuals(x: np.ndarray) -> np.ndarray:
        hw = hardware.with_values(dict(zip(names, np.exp(x).tolist(), strict=True)))
        return np.log([p.predicted_ms(hw) for p in points]) - measured

    result = least_squares(
        residuals, start, bounds=(start - 12.0, start + 12.0), xtol=1e-10, ftol=1e-10, gtol=1e-10
    )
    fitted = dict(zip(names, np.exp(result.x).tolist(), strict=True))
    rms = float(np.sqrt(np.mean(result.fun**2)))
    return Fit(
        hardware.with_values(fitted), fitted, f"{len(points)} measured passes", tuple(names), rms
    )


_UNIT = KernelMemory(fixed_mib=1.0, q_bytes=1.0, dense_bytes=1.0)
"""Unit terms: the model's memory with them is each term's column of the fit."""
_HOLDER = Hardware(
    name="unit terms",
    device="cpu",
    kernels={},
    intra=Link(1.0, 0.0),  # the memory model reads no link
    inter=Link(1.0, 0.0),
    efficiency={},
    memory_gib=0.0,
    memory_gbps=0.0,
)
"""A profile of nothing but memory terms: the fit puts its trial terms in it."""
_TERMS = ("kernel and harness, fixed", "kernel and harness, per token", "largest dense call")
"""`lcab.plan.frontier.rank_memory_terms`' names of the fixed, per-token and dense terms."""


def _columns(point: FrontierPoint) -> tuple[float, np.ndarray]:
    """(tensors and buffers MiB, [fixed, per-token, dense] MiB per unit term) at the middle."""
    unit = dataclasses.replace(_HOLDER, kernel_memory={"default": _UNIT})
    terms = rank_memory_terms(point.middle, point.backward, unit)
    base = sum(v for k, v in terms.items() if k not in _TERMS)
    return base, np.array([terms.get(name, 0.0) for name in _TERMS])


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``x @ c ≈ y`` with every ``c >= 0`` (a term dropped while it fits below 0)."""
    keep = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    coef = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        if not keep:
            break
        solved, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (solved >= 0).all():
            coef[keep] = solved
            break
        keep = [j for j, c in zip(keep, solved, strict=True) if c >= 0]
    return coef


def _fit_parallel(kernel: str, terms: KernelMemory, points: list[FrontierPoint]) -> KernelMemory:
    """``terms`` with ``cp_fixed_mib`` and ``cp_q_bytes`` fitted on the kernel's CP ``points``.

    One budget cannot tell a fixed part from a per-token one: with a single length (or all
    points at one), only ``cp_fixed_mib`` is fitted and the per-token part stays the world of
    one's.
    """
    unit = dataclasses.replace(terms, cp_fixed_mib=1.0, cp_q_bytes=1.0)
    held = dataclasses.replace(_HOLDER, kernel_memory={kernel: unit})
    rows, left = [], []
    for p in points:
        found = rank_memory_terms(p.middle, p.backward, held)
        fixed, per_token = found.get(_TERMS[0], 0.0), found.get(_TERMS[1], 0.0)
        rows.append([fixed, per_token])
        left.append(p.budget_mib - (sum(found.values()) - fixed - per_token))
    x, y = np.array(rows), np.array(left)
    if len({p.budget_mib for p in points}) > 1:
        fixed_mib, per_element = np.linalg.lstsq(x, y, rcond=None)[0]
        if per_element >= 0:
            return dataclasses.replace(
                terms,
                cp_fixed_mib=round(float(fixed_mib), 1),
                cp_q_bytes=round(float(per_element), 2),
            )
    alike = x[:, 1] * terms.q_bytes  # the per-token part a world of one has
    return dataclasses.replace(terms, cp_fixed_mib=round(float(np.mean(y - alike)), 1))


def fit_memory(points: list[FrontierPoint], hardware: Hardware) -> Fit:
    """Terms per kernel from its ``cp=none`` points, then its CP rank's own, then the margin.

    Raises:
        ValueError: no frontier point, or no single-device one (the kernels' terms need one).

    """
    if not points:
        raise ValueError(
            "no frontier record with a budget and both ends of its bracket "
            "(seqlen=frontier bench.memory_budget_gib=...)"
        )
    single = [p for p in points if p.cell.cp == "none"]
    if not single:
        raise ValueError("no cp=none frontier record: the kernels' memory terms are fitted on one")
    kernels: dict[str, KernelMemory] = {}
    parallel = 0
    for kernel in sorted({p.cell.kernel for p in single}):
        mine = [p for p in single if p.cell.kernel == kernel]
        bases, cols = zip(*(_columns(p) for p in mine), strict=True)
        y = np.array([p.budget_mib for p in mine]) - np.array(bases)
        fixed, per_token, dense = _nonnegative_fit(np.vstack(cols), y)
        terms = KernelMemory(
            fixed_mib=round(float(fixed), 1),
            q_bytes=round(float(per_token), 2),
            dense_bytes=round(float(dense), 2),
        )
        # a CP rank's own fixed and per-token parts: fitted on what its records leave over
        # with the kernel's dense-mask term and the strategy's buffers counted
        parallel_points = [p for p in points if p.cell.cp != "none" and p.cell.kernel == kernel]
        if parallel_points:
            terms = _fit_parallel(kernel, terms, parallel_points)
            parallel += len(parallel_points)
        kernels[kernel] = terms
    margin = fit_margin(points, dataclasses.replace(_HOLDER, kernel_memory=kernels))
    fitted = {f"kernel_memory.{k}.{n}": v for k, t in kernels.items() for n, v in vars(t).items()}
    hardware = dataclasses.replace(
        hardware,
        kernel_memory={**hardware.kernel_memory, **kernels},
        memory_margin=margin,
    )
    return Fit(
        hardware,
        {**fitted, "memory_margin": margin},
        f"{len(single)} single-device and {parallel} context-parallel frontiers",
        ("kernel_memory", "memory_margin"),
    )


def fit_margin(points: list[FrontierPoint], hardware: Hardware) -> float:
    """The least share of each budget (whole percent) ``hardware``'s model holds back to safety.

    Safe: its frontier at most the measured one in `SAFE_SHARE` of ``points``; found by
    bisection, since a larger margin never gives a longer frontier.
    """
    low, high = 0, 100
    while low < high:
        middle = (low + high) // 2
        checks = check_memory(points, dataclasses.replace(hardware, memory_margin=middle / 100))
        if sum(c.safe for c in checks) >= SAFE_SHARE * len(checks):
            high = middle
        else:
            low = middle + 1
    return low / 100


def main(argv: list[str]) -> int:
    """Fit, print, write; the exit code (2: bad input)."""
    parser = argparse.ArgumentParser(prog="python launchers/plan_fit.py", description=__doc__)
    parser.add_argument("fit", choices=("rates", "memory"), help="what to fit")
    parser.add_argument("records", type=Path, help="records (JSONL) of python -m lcab.main")
    record_options(parser)
    parser.add_argument("--out", help="where the fitted profile goes (YAML; default: stdout)")
    parser.add_argument(
        "--kernels-only", action="store_true", help="rates: the kernels' only (links held)"
    )
    args = parser.parse_args(argv)  # argparse exits with 2 on bad flags
    try:
        records = records_for(args.records, args.where)
        hardware = profile_for(args.hardware, records, args.set)
        if args.fit == "memory":
            fit = fit_memory(frontier_points(records), hardware)
        else:
            points = points_of(records)
            kernels = {p.cell.kernel for p in points}
            names = free_parameters(hardware, kernels, links=False) if args.kernels_only else None
            fit = fit_rates(points, hardware, names)
    except ValueError as err:
        print(f"plan_fit: {err}", file=sys.stderr)
        return 2
    screen = console()
    table = Table(title=f"{args.fit} of {hardware.name} fitted on {fit.points}")
    table.add_column("parameter")
    table.add_column("fitted", justify="right")
    for name, value in fit.parameters.items():
        table.add_row(name, f"{value:.4g}")
    screen.print(table)
    if fit.rms_log_error is not None:
        error = 100 * (np.exp(fit.rms_log_error) - 1)
        screen.print(f"rms error (log ratio): {fit.rms_log_error:.3f} (~{error:.0f} %)")
    command = " ".join(["python launchers/plan_fit.py", *argv])
    note = f"fitted by `{command}` on {fit.points}"
    profile = dataclasses.replace(
        fit.hardware, sources={**fit.hardware.sources, **dict.fromkeys(fit.sources, note)}
    )
    if args.fit == "memory":
        print_frontier_checks(frontier_points(records), profile)
    text = yaml.safe_dump(profile.to_dict(), sort_keys=False)
    if args.out:
        Path(args.out).write_text(text)
        screen.print(f"fitted profile -> {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
