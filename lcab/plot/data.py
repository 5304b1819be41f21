"""lcab's figures as plain data: the one layer both renderers draw.

A figure is panels of lines against a shared x axis (`LineFigure`) or a status grid
(`Heatmap`); everything a reader sees (titles, labels, colours, bands, failed points and why) is
fixed here, so the PNG (`lcab.plot.png`) and the page (`lcab.plot.html`) show the same and tests
check numbers without parsing images. It imports nothing of lcab, so the report and the planner
both build on it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

DASHES = ("solid", "dash", "dot", "dashdot")
"""Line styles telling apart the lines of one series (world sizes, variants), in order."""
MARKERS = {
    "circle": "o",
    "circle-open": "o",
    "square": "s",
    "diamond": "D",
    "diamond-open": "D",
    "triangle-down": "v",
    "x": "X",
    "x-thin-open": "x",
    "cross": "P",
    "hexagon-open": "h",
    "pentagon-open": "p",
    "star-open": "*",
}
"""Marker symbols (plotly's names; ``-open``: hollow) and matplotlib's marker for each."""
FAILED_NUDGE = 0.07
"""Octaves between failed points of different lines at one x (`FailedPoint.slot`)."""
MAX_RIMS = 4
"""At most this many steps wider for a line covered by later ones (`Line.under`)."""
EVENT_COLOUR = "#000000"
"""Rings around points a clock event flags."""


@dataclass(frozen=True)
class StatusStyle:
    """How a status is drawn: a heatmap colour, and a marker symbol for failed points."""

    colour: str
    symbol: str


STATUS_SEVERITY = ("ok", "skipped", "numerics_mismatch", "oom", "timeout", "error")
"""Statuses from best to worst (the order `RunRecord.finalise_status` combines them in)."""
STATUS_STYLES = {
    "ok": StatusStyle("#4daf4a", "circle"),
    "skipped": StatusStyle("#bdbdbd", "circle-open"),
    "numerics_mismatch": StatusStyle("#984ea3", "diamond"),
    "oom": StatusStyle("#ff7f00", "triangle-down"),
    "timeout": StatusStyle("#a65628", "square"),
    "error": StatusStyle("#e41a1c", "x"),
}


def status_style(status: str) -> StatusStyle:
    """The style of ``status`` (a black cross for a status this lcab does not know)."""
    return STATUS_STYLES.get(status, StatusStyle("#000000", "cross"))


def severity(status: str) -> int:
    """Rank of ``status`` in `STATUS_SEVERITY` (unknown statuses rank worst)."""
    return STATUS_SEVERITY.index(status) if status in STATUS_SEVERITY else len(STATUS_SEVERITY)


def seqlen_label(n: float) -> str:
    """``1K`` for 1024, ``128K``, ``1M``, ``1.5K``; plain numbers below 1024."""
    value = int(n)
    if value >= 1 << 20 and value % (1 << 17) == 0:
        return f"{value / (1 << 20):g}M"
    if value >= 1024 and value % 128 == 0:
        return f"{value / 1024:g}K"
    return f"{value:,}"


def log2_ticks(
    values: Iterable[float], *, label: bool = True, most: int = 9
) -> tuple[tuple[float, str], ...]:
    """Ticks at the data's own x values (thinned to at most ``most``, the largest kept).

    ``label``: sequence-length labels (``8K``); False: plain integers (world sizes).
    """
    xs = sorted({float(v) for v in values if v and v > 0})
    if len(xs) > most:
        step = math.ceil(len(xs) / most)
        xs = xs[::-1][::step][::-1]
    return tuple((x, seqlen_label(x) if label else f"{int(x)}") for x in xs)


def log2_range(values: Iterable[float], pad: float = 0.35) -> tuple[float, float] | None:
    """Axis limits padding the data by ``pad`` octaves, so edge markers are not clipped."""
    xs = [float(v) for v in values if v and v > 0]
    if not xs:
        return None
    return min(xs) / 2**pad, max(xs) * 2**pad


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


@dataclass(frozen=True)
class Line:
    """One line (or set of markers): its points, the optional band or bars, and its style.

    A line with no points stands in the legend for a series whose every length failed there,
    so its failed points' colour is named.
    """

    label: str
    series: str
    """The series it belongs to: the key of its colour."""
    colour: str
    dash: str
    """One of `DASHES`."""
    x: tuple[float, ...]
    y: tuple[float, ...]
    low: tuple[float, ...] | None = None
    """Lower edge of the band per point (NaN where a point has none); None: no band."""
    high: tuple[float, ...] | None = None
    markers_only: bool = False
    hover: tuple[str, ...] = ()
    """One text per point, lines separated by ``\\n``."""
    in_legend: bool = True
    """False for lines the panel title explains (the analytic crosses of the CP figure)."""
    under: int = 0
    """How many lines drawn after it in its panel cover it exactly (same points): renderers
    draw it that many steps wider, so a line equal to another still shows as a rim."""
    symbol: str = ""
    """Its points' marker (`MARKERS`); empty: dots on a line, crosses when markers only."""
    bars: bool = False
    """``low``/``high`` drawn as an error bar at each point rather than a band."""
    size: float = 0.0
    """Marker size in points; 0: the renderers' own for the kind of line."""

    @property
    def marker(self) -> str:
        """The marker symbol drawn (`MARKERS`)."""
        return self.symbol or ("x-thin-open" if self.markers_only else "circle")

    @property
    def marker_size(self) -> float:
        """Marker size in points (matplotlib's unit; plotly's pixels are 1.5 of them)."""
        return self.size or (6.0 if self.markers_only else 3.5)


@dataclass(frozen=True)
class FailedPoint:
    """A length (or world size) whose pass did not run ``ok``, drawn at the panel's floor."""

    x: float
    y: float
    status: str
    series: str
    label: str
    """The label of the line it belongs to."""
    colour: str
    reason: str
    """Where (length, world size) and why, for hover text."""
    slot: float = 0.0
    """Offset among the failures at the same x (centred on 0): renderers nudge x by it so
    failed points of several lines at one length do not hide each other."""


@dataclass(frozen=True)
class RefLine:
    """A horizontal reference line (the numerics tolerance)."""

    y: float
    label: str


@dataclass(frozen=True)
class Panel:
    """One subplot: a y axis and what is drawn against it."""

    title: str
    y_label: str
    y_log: bool
    lines: tuple[Line, ...]
    failed: tuple[FailedPoint, ...] = ()
    refs: tuple[RefLine, ...] = ()
    y_range: tuple[float, float] | None = None
    """Fixed y limits; None: automatic (from 0 on a linear axis, unless ``from_zero`` is off)."""
    from_zero: bool = True

    @property
    def y_ticks(self) -> tuple[tuple[float, str], ...]:
        """Ticks of a log y axis (`log_ticks`); empty: automatic."""
        if not self.y_log:
            return ()
        values = [y for line in self.lines for y in line.y]
        values += [v for line in self.lines for v in (*(line.low or ()), *(line.high or ()))]
        values += [p.y for p in self.failed] + [r.y for r in self.refs]
        return log_ticks(values)

    @property
    def has_values(self) -> bool:
        """Whether any line has a point (a line may be only a legend entry for failures)."""
        return any(line.x for line in self.lines)


@dataclass(frozen=True)
class Axis:
    """The shared x axis of a figure's panels: log2 (lengths, world sizes) or linear (time)."""

    label: str
    ticks: tuple[tuple[float, str], ...]
    """Empty: the renderer's own."""
    limits: tuple[float, float] | None
    log: bool = True


@dataclass(frozen=True)
class LineFigure:
    """Panels side by side (or ``stacked``) sharing an x axis; ``name`` is the file stem."""

    name: str
    section: str
    title: str
    x: Axis
    panels: tuple[Panel, ...]
    stacked: bool = False


@dataclass(frozen=True)
class Heatmap:
    """Rows x columns of statuses (None: no record), each cell annotated with ``text``."""

    name: str
    section: str
    title: str
    row_label: str
    column_label: str
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    status: tuple[tuple[str | None, ...], ...]
    text: tuple[tuple[str, ...], ...]


FigureData = LineFigure | Heatmap


def log2_axis(label: str, values: Iterable[float], *, seqlens: bool = True) -> Axis:
    """A log2 x axis ticked at the data (`log2_ticks`; ``seqlens``: ``8K`` labels), padded."""
    xs = list(values)
    return Axis(label, log2_ticks(xs, label=seqlens), log2_range(xs))


def name_stem(text: str) -> str:
    """``text`` as part of a figure name (a file stem and a page id): ``causal_document``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"
