"""How the report's plots look, decided once for both renderers (PNG and interactive page).

A reader compares figures side by side, so one kernel (or one CP strategy) has one colour in
every plot and in both renderers, the lines of one series (its world sizes, variants) differ
by dash, one failure status has one marker, and sequence lengths read as ``1K``, ``8K``,
``128K`` on a log2 axis everywhere. `Styler` fixes colours from the registries (`palette`: a
kernel keeps its colour across reports) and dashes from the sorted (world size, variant) pairs
of each series, so neither depends on the order plots are drawn in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from lcab.report.frame import SERIES, VARIANT

SERIES_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#3182bd",
    "#e7ba52",
    "#ad494a",
    "#a55194",
    "#6b6ecf",
    "#9c9ede",
    "#cedb9c",
    "#e7969c",
    "#de9ed6",
    "#31a354",
    "#756bb1",
    "#636363",
    "#fd8d3c",
    "#3b5b92",
    "#b5cf6b",
    "#d6616b",
    "#8ca252",
)
"""Qualitative colours: the kernels declare theirs (`Kernel.colour`); CP strategies and series
the registries do not know take the rest (see `palette`)."""

DASHES = ("solid", "dash", "dot", "dashdot")
"""Line styles telling apart the lines of one series (world sizes, variants), in order."""
MPL_DASHES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}
"""`DASHES` as matplotlib line styles."""


@dataclass(frozen=True)
class StatusStyle:
    """How a status is drawn: a heatmap colour, and a marker for failed points."""

    colour: str
    mpl_marker: str
    plotly_symbol: str


STATUS_SEVERITY = ("ok", "skipped", "numerics_mismatch", "oom", "timeout", "error")
"""Statuses from best to worst (the order `RunRecord.finalise_status` combines them in)."""
STATUS_STYLES = {
    "ok": StatusStyle("#4daf4a", "o", "circle"),
    "skipped": StatusStyle("#bdbdbd", "o", "circle-open"),
    "numerics_mismatch": StatusStyle("#984ea3", "D", "diamond"),
    "oom": StatusStyle("#ff7f00", "v", "triangle-down"),
    "timeout": StatusStyle("#a65628", "s", "square"),
    "error": StatusStyle("#e41a1c", "X", "x"),
}
_UNKNOWN_STATUS = StatusStyle("#000000", "P", "cross")

PASS_MARKERS = {"fwd": ("o", "circle"), "bwd": ("s", "square"), "fwd_bwd": ("D", "diamond")}
"""Pass -> (matplotlib marker, plotly symbol) of the points of a time figure (its colour is
its series')."""
EVENT_MARKERS = (
    ("o", "circle-open"),
    ("D", "diamond-open"),
    ("h", "hexagon-open"),
    ("p", "pentagon-open"),
    ("*", "star-open"),
)
"""Hollow rings drawn around points a clock event flags, one per set of reasons (cycling)."""
EVENT_COLOUR = "#000000"


def status_style(status: str) -> StatusStyle:
    """The style of ``status`` (a black cross for a status this lcab does not know)."""
    return STATUS_STYLES.get(status, _UNKNOWN_STATUS)


def severity(status: str) -> int:
    """Rank of ``status`` in `STATUS_SEVERITY` (unknown statuses rank worst)."""
    return STATUS_SEVERITY.index(status) if status in STATUS_SEVERITY else len(STATUS_SEVERITY)


def _preferred_colour(series: str) -> str | None:
    """A series' own colour: its kernel's (`Kernel.colour`) or its CP strategy's.

    Colours come from the registries, not from what a report holds, so ``ranges`` keeps its
    colour from one report (or README figure) to the next. A strategy takes, in registration
    order, the colours of `SERIES_COLOURS` that no kernel declares.
    """
    from lcab.cp import STRATEGIES
    from lcab.kernels import KERNELS

    key = series.split("/", 1)[0]  # "<cp>/<kernel>": coloured by the strategy
    if key in KERNELS:
        return KERNELS.get(key).colour
    declared = {KERNELS.get(name).colour for name in KERNELS.names()}
    free = [c for c in SERIES_COLOURS if c not in declared] or list(SERIES_COLOURS)
    strategies = STRATEGIES.names()
    return free[strategies.index(key) % len(free)] if key in strategies else None


def palette(names: Iterable[str]) -> dict[str, str]:
    """One distinct colour per series name, the same whatever else the report holds.

    Each series gets its preferred colour (`_preferred_colour`) unless a series before it in
    sorted order took that colour; those, and names the registries do not know, take the first
    colours still free (cycling once all are used).
    """
    colours: dict[str, str] = {}
    for name in sorted(set(names)):
        colour = _preferred_colour(name)
        if colour is not None and colour not in colours.values():
            colours[name] = colour
    for name in sorted(set(names) - colours.keys()):
        free = [c for c in SERIES_COLOURS if c not in colours.values()]
        colours[name] = free[0] if free else SERIES_COLOURS[len(colours) % len(SERIES_COLOURS)]
    return colours


def seqlen_label(n: float) -> str:
    """``1K`` for 1024, ``128K``, ``1M``, ``1.5K``; plain numbers below 1024."""
    value = int(n)
    if value >= 1 << 20 and value % (1 << 17) == 0:
        return f"{value / (1 << 20):g}M"
    if value >= 1024 and value % 128 == 0:
        return f"{value / 1024:g}K"
    return f"{value:,}"


def hardware_label(frame: pd.DataFrame) -> str:
    """What the figures ran on, for titles: ``float32 on AMD EPYC (cpu)``.

    A figure read without its page (a PNG in a paper or README) must say that 0.1 TFLOP/s is a
    CPU figure; mixed inputs are counted rather than listed, unknown parts left out.
    """
    dtypes = sorted({str(d) for d in frame["dtype"].dropna() if d})
    devices = sorted(
        {
            f"{name} ({kind})" if name else str(kind)
            for name, kind in zip(frame["device_name"], frame["device"], strict=True)
            if name or kind
        }
    )
    parts = [dtypes[0] if len(dtypes) == 1 else f"{len(dtypes)} dtypes" if dtypes else ""]
    if devices:
        parts.append(devices[0] if len(devices) == 1 else f"{len(devices)} device types")
    return " on ".join(p for p in parts if p)


def log2_ticks(
    values: Iterable[float], *, label: bool = True, most: int = 9
) -> tuple[tuple[float, str], ...]:
    """Ticks at the data's own x values (thinned to at most ``most``, the largest kept).

    Args:
        values: the x values on the axis.
        label: True: sequence-length labels (``8K``); False: plain integers (world sizes).
        most: the most ticks to show.

    """
    xs = sorted({float(v) for v in values if v and v > 0})
    if len(xs) > most:
        step = math.ceil(len(xs) / most)
        xs = xs[::-1][::step][::-1]
    return tuple((x, seqlen_label(x) if label else f"{int(x)}") for x in xs)


LOG_STEPS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0))
"""Tick mantissas per decade on a log y axis, coarsest first."""


def log_ticks(
    values: Iterable[float], *, fewest: int = 4, most: int = 8
) -> tuple[tuple[float, str], ...]:
    """Ticks for a log axis over ``values``, labelled as plain numbers (``200``, ``1e-06``).

    The coarsest of `LOG_STEPS` giving at least ``fewest`` ticks: decades over a wide range
    (every other one past ``most``), 1-2-5 or finer over a narrow one, where default log ticks
    would leave one label or none. Empty when even the finest gives too few.
    """
    xs = [float(v) for v in values if v and v > 0 and math.isfinite(v)]
    if not xs:
        return ()
    lo, hi = min(xs) / 1.25, max(xs) * 1.25
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for steps in LOG_STEPS:
        ticks = [
            float(f"{m * 10.0**k:.6g}")
            for k in range(first, last + 1)
            for m in steps
            if lo <= m * 10.0**k <= hi
        ]
        if len(ticks) >= fewest:
            if len(ticks) > most:
                ticks = ticks[:: math.ceil(len(ticks) / most)]
            return tuple((tick, f"{tick:g}") for tick in ticks)
    return ()


def log2_range(values: Iterable[float], pad: float = 0.35) -> tuple[float, float] | None:
    """Axis limits padding the data by ``pad`` octaves, so edge markers are not clipped."""
    xs = [float(v) for v in values if v and v > 0]
    if not xs:
        return None
    return min(xs) / 2**pad, max(xs) * 2**pad


@dataclass(frozen=True)
class LineStyle:
    """Legend label, palette key, colour and dash of one line."""

    label: str
    series: str
    colour: str
    dash: str


class Styler:
    """The report's colours (one per series) and dashes (per series, world size, variant)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.colours = palette(frame[SERIES])
        self.dashes: dict[tuple[str, int, str], str] = {}
        keys = frame[[SERIES, "world_size", VARIANT]].drop_duplicates()
        for series, group in keys.groupby(SERIES, sort=True):
            pairs = sorted(zip(group["world_size"], group[VARIANT], strict=True))
            for i, (world, variant) in enumerate(pairs):
                self.dashes[(str(series), int(world), str(variant))] = DASHES[i % len(DASHES)]

    def line(self, series: str, world: int | None, variant: str, cp: bool) -> LineStyle:
        """The style of a line; ``world`` None: the line runs across world sizes."""
        label = f"{series} ×{world}" if cp and world is not None else series
        return LineStyle(
            label=f"{label} [{variant}]" if variant else label,
            series=series,
            colour=self.colours[series],
            dash="solid" if world is None else self.dashes.get((series, world, variant), "solid"),
        )
