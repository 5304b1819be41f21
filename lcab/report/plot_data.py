"""The report's figures as plain data: what `lcab.report.figures` decides, renderers draw.

A figure is panels of lines against a log2 x axis (`LineFigure`), a status grid (`Heatmap`)
or readings against the time of a sweep (`TimeFigure`, `lcab.report.clocks`). Everything a
reader sees — titles, axis labels with units, legend text, colours, the p20–p80 band, failed
lengths and why they failed — is fixed here, so the PNG and the interactive page show the same
thing and tests can check numbers without parsing images.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lcab.report.plot_style import log_ticks


@dataclass(frozen=True)
class Line:
    """One line: its points (x ascending), the optional band around them, and its style.

    A line with no points stands in the legend for a series whose every length failed there,
    so its failed points' colour is named.
    """

    label: str
    series: str
    """The ``series`` (`lcab.report.frame`) it belongs to: the key of its colour."""
    colour: str
    dash: str
    """One of `lcab.report.plot_style.DASHES`."""
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
    """Fixed y limits; None: automatic (from 0 on a linear axis)."""

    @property
    def y_ticks(self) -> tuple[tuple[float, str], ...]:
        """Ticks of a log y axis (`lcab.report.plot_style.log_ticks`); empty: automatic."""
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
    """The shared x axis of a figure's panels (always log2: lengths or world sizes)."""

    label: str
    ticks: tuple[tuple[float, str], ...]
    limits: tuple[float, float] | None


@dataclass(frozen=True)
class LineFigure:
    """Panels side by side sharing an x axis; ``name`` is the PNG stem and the page id."""

    name: str
    section: str
    title: str
    x: Axis
    panels: tuple[Panel, ...]


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


PASS_NUDGE = {"fwd": -0.006, "bwd": 0.006, "fwd_bwd": 0.0}
"""Offset of each pass's points in a `TimeFigure`, as a share of its time span."""


@dataclass(frozen=True)
class TimePoint:
    """One pass of one record at the time its length began, with the spread of its reading."""

    x: float
    """Minutes after the sweep's first record."""
    y: float
    low: float | None
    """Lower end of the bar (a clock's lowest reading); None: no bar."""
    high: float | None
    series: str
    """The ``series`` (`lcab.report.frame`): the key of its colour."""
    label: str
    """The legend label of its series (`lcab.report.plot_style.Styler.line`)."""
    colour: str
    pass_name: str
    """fwd, bwd or fwd_bwd: the marker (`lcab.report.plot_style.PASS_MARKERS`)."""
    events: tuple[str, ...] = ()
    """Clock-event (throttle) reasons that flag the point; empty: not flagged."""
    hover: str = ""
    """Its numbers, lines separated by ``\\n``."""


@dataclass(frozen=True)
class TimePanel:
    """One panel of a `TimeFigure`: a y axis (linear, not from 0) and its points."""

    title: str
    y_label: str
    points: tuple[TimePoint, ...]


@dataclass(frozen=True)
class TimeFigure:
    """Panels stacked top to bottom, sharing a linear time axis in minutes."""

    name: str
    section: str
    title: str
    x_label: str
    panels: tuple[TimePanel, ...]

    def drawn_x(self, point: TimePoint) -> float:
        """Where a point is drawn: its time, nudged by its pass (`PASS_NUDGE`).

        The passes of one record sit side by side (fwd left of bwd), so neither hides the
        other's bar; the hover gives the time itself.
        """
        xs = [p.x for panel in self.panels for p in panel.points]
        span = (max(xs) - min(xs)) if xs else 0.0
        return point.x + PASS_NUDGE.get(point.pass_name, 0.0) * (span or 1.0)

    @property
    def event_sets(self) -> tuple[tuple[str, ...], ...]:
        """The distinct sets of flagging reasons, in a fixed order (one marker each)."""
        found = {p.events for panel in self.panels for p in panel.points if p.events}
        return tuple(sorted(found, key=lambda e: (len(e), e)))


FigureData = LineFigure | Heatmap | TimeFigure


@dataclass(frozen=True)
class Omitted:
    """A figure (or a group of figures) not drawn, and why; the page says so."""

    section: str
    why: str


@dataclass
class Figures:
    """Everything `lcab.report.figures.build_figures` decided, in page order."""

    figures: list[FigureData] = field(default_factory=list)
    omitted: list[Omitted] = field(default_factory=list)
    colours: dict[str, str] = field(default_factory=dict)
    """The palette: one colour per series, shared by every figure and both renderers."""

    def by_section(self, section: str) -> list[FigureData]:
        """The figures of one page section, in order."""
        return [f for f in self.figures if f.section == section]


SECTIONS = {
    "compare": "Compared with the baseline",
    "support": "Support matrix",
    "throughput": "Throughput",
    "scaling": "CP scaling",
    "memory": "Peak memory",
    "numerics": "Numerical error",
    "cp": "CP load balance and communication",
    "telemetry": "Clocks and power",
    "frontier": "Memory frontier",
}
"""Page sections in order: key (`LineFigure.section`) -> heading."""
OPTIONAL_SECTIONS = frozenset({"compare", "telemetry", "frontier"})
"""Sections the page shows only when they have a figure, a table or a reason it was not drawn
(records without telemetry have nothing to say about clocks, records of ordinary sweeps nothing
about a memory frontier, a report without named runs compares nothing)."""


def name_stem(text: str) -> str:
    """``text`` as part of a figure name (a file stem and a page id): ``causal_document``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"
