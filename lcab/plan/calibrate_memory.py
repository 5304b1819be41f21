"""Fit a profile's kernel memory terms to measured frontiers, and check a profile against them.

A frontier record (``seqlen=frontier``) says that at its budget the cell ran at
``frontier_bracket[0]`` tokens and ran out of memory at ``frontier_bracket[1]``: the budget is
what the fullest rank holds somewhere in between. The fit takes the middle of the bracket and
solves, per kernel, for the terms of `lcab.plan.hardware.KernelMemory` that make the model's
memory there equal the budget (least squares over the kernel's single-device records, no term
negative), then for each kernel's `KernelMemory.cp_fixed_mib` and ``cp_q_bytes`` by least
squares on what its context-parallel records leave over (only the fixed part where they were
all measured at one budget). A cell measured more than once counts once, at its shortest
frontier (twice the weight otherwise; the safe side). Last, the margin
(`lcab.plan.hardware.Hardware.memory_margin`): the least share of the budget to hold back so
that the model's frontier would have run in at least `SAFE_SHARE` of the cells. The check
searches each record's frontier in the model, as the planner does
(`lcab.plan.frontier.predict_frontier`), and prints it beside the measured one.

Fitting and checking on the same records shows how well the terms can fit, nothing more: fit at
one budget and check at another (``--where frontier_budget_gib=0.3,0.4``, then the 0.2 records).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lcab.plan.frontier import predict_frontier, rank_memory_terms
from lcab.plan.hardware import Hardware, KernelMemory, Link
from lcab.plan.predict import PlanCell
from lcab.records.schema import RunRecord

_UNIT = KernelMemory(fixed_mib=1.0, q_bytes=1.0, dense_bytes=1.0)
"""Unit terms: the model's memory with them is each term's column of the fit."""


@dataclass(frozen=True)
class FrontierPoint:
    """One measured frontier: the cell, its budget and the bracket around its limit."""

    cell: PlanCell
    """The cell at the first probe's length (where a search starts)."""
    budget_mib: float
    fits: int
    fails: int
    backward: bool
    limit: int
    resolution: int

    @property
    def middle(self) -> PlanCell:
        """The cell at the middle of the bracket, where its memory is taken to be the budget."""
        return dataclasses.replace(self.cell, seqlen=(self.fits + self.fails) // 2)

    def label(self) -> str:
        """Kernel, strategy, mask and budget, for tables."""
        return (
            f"{self.cell.kernel}/{self.cell.cp}/{self.cell.mask} @ {self.budget_mib / 1024:g} GiB"
        )


SEARCHED = ("ok", "numerics_mismatch", "oom")
"""Probe statuses of a search that ran to its end (`lcab.bench.frontier`)."""


SAFE_SHARE = 0.95
"""Share of the fit's cells whose measured frontier the planner's must not exceed."""


def frontier_points(records: list[RunRecord]) -> list[FrontierPoint]:
    """The records that found a limit under a stated budget, one per cell.

    Both ends of the bracket known, every probe ``ok`` or ``oom``; a cell searched again under
    the same budget and search counts once, at its shortest frontier.
    """
    points: dict[str, FrontierPoint] = {}
    for r in records:
        bracket = r.frontier_bracket or [None, None]
        if r.frontier_budget_gib is None or None in bracket or not r.frontier_probes:
            continue
        if any(p.get("status") not in SEARCHED for p in r.frontier_probes):
            continue  # the search stopped (a probe's error): its bracket is not the limit's
        seqlen = dict(r.config.get("seqlen") or {})
        start = int(r.frontier_probes[0]["seqlen"])
        point = FrontierPoint(
            cell=PlanCell.of_record(r).with_(seqlen=start),
            budget_mib=float(r.frontier_budget_gib) * 1024,
            fits=int(bracket[0]),  # type: ignore[arg-type]
            fails=int(bracket[1]),  # type: ignore[arg-type]
            backward=any(p != "fwd" for p in r.passes),
            limit=int(seqlen.get("frontier_max") or 1 << 24),
            resolution=int(seqlen.get("frontier_resolution") or 16),
        )
        same = repr(dataclasses.replace(point, fits=0, fails=0))
        if same not in points or point.fits < points[same].fits:
            points[same] = point
    return list(points.values())


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


def _columns(point: FrontierPoint) -> tuple[float, np.ndarray]:
    """(tensors and buffers MiB, [fixed, per-token, dense] MiB per unit term) at the middle."""
    unit = dataclasses.replace(_HOLDER, kernel_memory={"default": _UNIT})
    terms = rank_memory_terms(point.middle, point.backward, unit)
    columns = np.array(
        [
            terms.get("kernel and harness, fixed", 0.0),
            terms.get("kernel and harness, per token", 0.0),
            terms.get("largest dense call", 0.0),
        ]
    )
    named = {"kernel and harness, fixed", "kernel and harness, per token", "largest dense call"}
    base = sum(v for k, v in terms.items() if k not in named)
    return base, columns


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


@dataclass(frozen=True)
class MemoryFit:
    """Fitted terms per kernel, and the records used."""

    kernels: dict[str, KernelMemory]
    single: int
    """Single-device records the kernels' terms were fitted on."""
    parallel: int
    """Context-parallel records the kernels' ``cp_fixed_mib`` were fitted on."""
    margin: float = 0.0
    """`Hardware.memory_margin` that keeps `SAFE_SHARE` of these records safe (`fit_margin`)."""

    def apply(self, hardware: Hardware) -> Hardware:
        """``hardware`` with these terms (other kernels' terms kept) and this margin."""
        return dataclasses.replace(
            hardware,
            kernel_memory={**hardware.kernel_memory, **self.kernels},
            memory_margin=self.margin,
        )


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
        fixed = found.get("kernel and harness, fixed", 0.0)
        per_token = found.get("kernel and harness, per token", 0.0)
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


def fit_memory(points: list[FrontierPoint]) -> MemoryFit:
    """Terms per kernel from its ``cp=none`` points, then its CP rank's own from the rest.

    Raises:
        ValueError: no single-device point (the kernels' terms need one).

    """
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
    return MemoryFit(kernels, len(single), parallel, margin)


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


@dataclass(frozen=True)
class FrontierCheck:
    """A measured frontier beside the one ``hardware``'s model finds for the same search."""

    point: FrontierPoint
    predicted: int | None

    @property
    def ratio(self) -> float | None:
        """Measured / predicted tokens."""
        return self.point.fits / self.predicted if self.predicted else None

    @property
    def safe(self) -> bool:
        """Predicted ≤ measured: the length the planner gives would have run."""
        return self.predicted is None or self.predicted <= self.point.fits


def check_memory(points: list[FrontierPoint], hardware: Hardware) -> list[FrontierCheck]:
    """Each point's frontier searched in ``hardware``'s model from the same start."""
    return [
        FrontierCheck(
            p,
            predict_frontier(
                p.cell, p.budget_mib, p.backward, p.limit, p.resolution, hardware
            ).tokens,
        )
        for p in points
    ]


def within(checks: list[FrontierCheck], band: float = 0.25) -> int:
    """How many checks have their predicted frontier within ``band`` of the measured one."""
    return sum(1 for c in checks if c.ratio is not None and abs(c.ratio - 1) <= band)
