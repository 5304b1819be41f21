"""The report's figures in page order, what was left out and why, and the page's sections.

What each figure shows is `lcab.report.figures`' decision, drawn from `lcab.plot.data`'s
figure types by `lcab.plot.png` (the PNGs) and `lcab.plot.html` (the page).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lcab.plot.data import FigureData


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
