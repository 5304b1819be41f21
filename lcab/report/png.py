"""The matplotlib renderer: one PNG per figure, for papers and the README.

It draws `lcab.report.plot_data` figures as they are (no decisions of its own beyond layout),
on a `matplotlib.figure.Figure` with the Agg canvas — no pyplot, so no global backend state and
no display needed. matplotlib is imported inside the functions so importing `lcab.report` stays
fast for commands that draw nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcab.report.plot_data import FigureData, Heatmap, LineFigure, Panel, TimeFigure
from lcab.report.plot_style import (
    EVENT_COLOUR,
    EVENT_MARKERS,
    MPL_DASHES,
    PASS_MARKERS,
    severity,
    status_style,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 150
FAILED_NUDGE = 0.07
"""Octaves between failed points of different lines at one x (`FailedPoint.slot`)."""
MAX_RIMS = 4
"""At most this many steps wider for a line covered by later ones (`Line.under`)."""
PANEL_SIZE = (5.6, 4.2)
"""Inches per panel (width, height) before the legend below."""
TIME_PANEL_SIZE = (9.0, 3.0)
"""Inches per panel of a time figure (panels stacked)."""


def render_png(figure: FigureData, path: Path, dpi: int = DPI) -> Path:
    """Draw ``figure`` to the PNG file ``path`` (its folder must exist); returns ``path``."""
    draw(figure).savefig(path, dpi=dpi, format="png")
    return path


def draw(figure: FigureData) -> Figure:
    """The matplotlib figure of ``figure`` (Agg canvas; save it or inspect its artists)."""
    if isinstance(figure, Heatmap):
        return _heatmap(figure)
    if isinstance(figure, TimeFigure):
        return _time_figure(figure)
    return _line_figure(figure)


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _line_figure(figure: LineFigure) -> Figure:
    entries = _legend_size(figure)
    columns = max(1, min(4, 2 * len(figure.panels)))
    legend_rows = -(-entries // columns)
    width, height = PANEL_SIZE
    fig = _new_figure(width * len(figure.panels), height + 0.22 * legend_rows)
    axes = fig.subplots(1, len(figure.panels), squeeze=False)[0]
    handles: dict[str, Any] = {}
    for ax, panel in zip(axes, figure.panels, strict=True):
        _draw_panel(ax, panel, figure, handles)
    fig.suptitle(figure.title, fontsize=11)
    ordered = [handles[k] for k in sorted(handles, key=_legend_order)]
    fig.legend(
        handles=ordered,
        labels=[h.get_label() for h in ordered],
        loc="outside lower center",
        ncols=columns,
        fontsize=8,
        frameon=False,
    )
    return fig


def _legend_size(figure: LineFigure) -> int:
    labels = {line.label for p in figure.panels for line in p.lines if line.in_legend}
    labels |= {f.status for p in figure.panels for f in p.failed}
    labels |= {r.label for p in figure.panels for r in p.refs}
    return len(labels)


def _legend_order(key: str) -> tuple[int, str]:
    """Lines first (by label), then references, then failure statuses by severity."""
    kind, _, name = key.partition(":")
    if kind == "status":
        return 2, f"{severity(name):02d}"
    return (1 if kind == "ref" else 0), name


def _draw_panel(ax: Axes, panel: Panel, figure: LineFigure, handles: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    for line in panel.lines:
        if line.low is not None and line.high is not None:
            ax.fill_between(line.x, line.low, line.high, color=line.colour, alpha=0.18, lw=0)
        rim = min(line.under, MAX_RIMS)
        style: dict[str, Any] = (
            {"linestyle": "none", "marker": "x", "markersize": 6 + 2 * rim, "mew": 1.5}
            if line.markers_only
            else {"linestyle": MPL_DASHES[line.dash], "marker": "o", "markersize": 3.5 + 1.5 * rim}
        )
        ax.plot(line.x, line.y, color=line.colour, label=line.label, lw=1.6 + 1.5 * rim, **style)
        if line.in_legend:
            key = f"line:{line.label}"
            handles.setdefault(key, Line2D([], [], color=line.colour, label=line.label, **style))
            # the legend shows the plain line, not a widened rim
            handles[key].set(lw=1.6, markersize=6 if line.markers_only else 3.5)
    for ref in panel.refs:
        artist = ax.axhline(ref.y, color="#444444", linestyle="--", lw=1, label=ref.label)
        handles.setdefault(f"ref:{ref.label}", artist)
    for status in sorted({f.status for f in panel.failed}):
        points = [f for f in panel.failed if f.status == status]
        look = status_style(status)
        hollow = look.plotly_symbol.endswith("-open")
        ax.scatter(
            [f.x * 2 ** (FAILED_NUDGE * f.slot) for f in points],
            [f.y for f in points],
            marker=look.mpl_marker,
            s=42,
            facecolors="none" if hollow else [f.colour for f in points],
            edgecolors=[f.colour for f in points],
            linewidths=1.3,
            zorder=5,
            clip_on=False,
        )
        handles.setdefault(
            f"status:{status}",
            Line2D(
                [],
                [],
                linestyle="none",
                marker=look.mpl_marker,
                markersize=7,
                markerfacecolor="none" if hollow else "#555555",
                markeredgecolor="#555555",
                label=f"{status} (colour: its line)",
            ),
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks([t for t, _ in figure.x.ticks], [label for _, label in figure.x.ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    if figure.x.limits:
        ax.set_xlim(*figure.x.limits)
    if panel.y_log:
        ax.set_yscale("log")
        if panel.y_ticks:
            from matplotlib.ticker import NullFormatter

            ax.set_yticks([t for t, _ in panel.y_ticks], [label for _, label in panel.y_ticks])
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            plain = _plain_log_formatter()
            ax.yaxis.set_major_formatter(plain(labelOnlyBase=False))
            ax.yaxis.set_minor_formatter(plain(labelOnlyBase=False))
    if panel.y_range:
        ax.set_ylim(*panel.y_range)
    elif not panel.y_log:
        ax.set_ylim(bottom=0)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(figure.x.label)
    ax.set_ylabel(panel.y_label)
    ax.grid(True, which="major", alpha=0.3)


def _plain_log_formatter() -> type:
    from matplotlib.ticker import LogFormatter

    class PlainLog(LogFormatter):
        """Log-axis labels as plain numbers (``200``, ``1e-06``) rather than ``2×10²``."""

        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    return PlainLog


def _heatmap(figure: Heatmap) -> Figure:
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    longest = max((len(t.split("\n")) for row in figure.text for t in row), default=1)
    row_height = 0.28 + 0.2 * longest
    width = max(6.5, 2.4 + 1.9 * len(figure.columns))
    fig = _new_figure(width, 1.6 + row_height * len(figure.rows))
    ax = fig.subplots()
    image = [
        [to_rgb(status_style(s).colour) if s else (1.0, 1.0, 1.0) for s in row]
        for row in figure.status
    ]
    ax.imshow(image, aspect="auto")
    for i, row in enumerate(figure.text):
        for j, text in enumerate(row):
            status = figure.status[i][j]
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=_ink(status))
    ax.set_xticks(range(len(figure.columns)), figure.columns)
    ax.set_yticks(range(len(figure.rows)), figure.rows)
    ax.tick_params(which="both", length=0)
    ax.set_xticks([x - 0.5 for x in range(1, len(figure.columns))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(figure.rows))], minor=True)
    ax.grid(True, which="minor", color="white", lw=2)
    ax.set_xlabel(figure.column_label)
    ax.set_ylabel(figure.row_label)
    ax.set_title(_wrap_title(figure.title), fontsize=10)
    present = {s for row in figure.status for s in row if s}
    legend = [
        Patch(color=status_style(s).colour, label=s)
        for s in sorted(present, key=lambda s: (severity(s), s))
    ]
    fig.legend(handles=legend, loc="outside lower center", ncols=len(legend) or 1, fontsize=8)
    return fig


def _wrap_title(title: str) -> str:
    """A title's parenthesised explanation on its own line (heatmaps are narrow)."""
    head, sep, tail = title.partition(" (")
    return f"{head}\n({tail}" if sep else title


def _ink(status: str | None) -> str:
    """Black text on light cells, white on dark ones."""
    from matplotlib.colors import to_rgb

    if status is None:
        return "#777777"
    r, g, b = to_rgb(status_style(status).colour)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _time_figure(figure: TimeFigure) -> Figure:
    """A `TimeFigure`: panels stacked over one time axis.

    A marker per pass in its series' colour, the reading's spread as a bar, a ring around the
    points a clock event flags.
    """
    from matplotlib.lines import Line2D

    points = [p for panel in figure.panels for p in panel.points]
    series = dict(sorted({p.label: p.colour for p in points}.items()))
    passes = [p for p in PASS_MARKERS if any(q.pass_name == p for q in points)]
    rings = {
        events: EVENT_MARKERS[i % len(EVENT_MARKERS)] for i, events in enumerate(figure.event_sets)
    }
    handles = [Line2D([], [], color=c, lw=3, label=label) for label, c in series.items()]
    handles += [
        Line2D([], [], color="#555555", marker=PASS_MARKERS[p][0], ls="none", label=p)
        for p in passes
    ]
    handles += [
        Line2D(
            [],
            [],
            color=EVENT_COLOUR,
            marker=marker,
            ms=10,
            mfc="none",
            ls="none",
            label=f"clock events: {', '.join(events)}",
        )
        for events, (marker, _) in rings.items()
    ]
    columns = 3
    width, height = TIME_PANEL_SIZE
    legend_rows = -(-len(handles) // columns)
    fig = _new_figure(width, height * len(figure.panels) + 0.6 + 0.22 * legend_rows)
    axes = fig.subplots(len(figure.panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, panel in zip(axes, figure.panels, strict=True):
        groups: dict[tuple[str, str], list[Any]] = {}
        for point in panel.points:
            groups.setdefault((point.label, point.pass_name), []).append(point)
        for (_, pass_), group in groups.items():
            ys = [p.y for p in group]
            bars = None
            if any(p.low is not None and p.high is not None for p in group):
                below = [max(0.0, p.y - p.low) if p.low is not None else 0.0 for p in group]
                above = [max(0.0, p.high - p.y) if p.high is not None else 0.0 for p in group]
                bars = [below, above]
            ax.errorbar(
                [figure.drawn_x(p) for p in group],
                ys,
                yerr=bars,
                fmt=PASS_MARKERS[pass_][0],
                color=group[0].colour,
                ms=5,
                elinewidth=1,
                capsize=2,
                alpha=0.9,
            )
        for events, (marker, _) in rings.items():
            flagged = [p for p in panel.points if p.events == events]
            if flagged:
                ax.scatter(
                    [figure.drawn_x(p) for p in flagged],
                    [p.y for p in flagged],
                    marker=marker,
                    s=150,
                    facecolors="none",
                    edgecolors=EVENT_COLOUR,
                    linewidths=1.1,
                    zorder=5,
                )
        ax.margins(y=0.15)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.y_label)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel(figure.x_label)
    fig.suptitle(figure.title, fontsize=11)
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=columns,
        fontsize=8,
        frameon=False,
    )
    return fig
