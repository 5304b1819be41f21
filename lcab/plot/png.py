"""The matplotlib renderer: one PNG per `lcab.plot.data` figure, for papers and the README.

It draws on a `matplotlib.figure.Figure` with the Agg canvas: no pyplot, so no global backend
state and no display; matplotlib is imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcab.plot.data import (
    FAILED_NUDGE,
    MARKERS,
    MAX_RIMS,
    FigureData,
    Heatmap,
    Line,
    LineFigure,
    Panel,
    severity,
)
from lcab.plot.data import status_style as style_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 150
DASH_STYLES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}


def render_png(figure: FigureData, path: Path, dpi: int = DPI) -> Path:
    """Draw ``figure`` to the PNG file ``path`` (its folder must exist); returns ``path``."""
    draw(figure).savefig(path, dpi=dpi, format="png")
    return path


def draw(figure: FigureData) -> Figure:
    """The matplotlib figure of ``figure`` (Agg canvas; save it or inspect its artists)."""
    return _heatmap(figure) if isinstance(figure, Heatmap) else _line_figure(figure)


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _line_figure(figure: LineFigure) -> Figure:
    """Panels side by side (5.6 x 4.2 in each) or stacked (9 x 3 in each), a legend below."""
    n = len(figure.panels)
    labels = {line.label for p in figure.panels for line in p.lines if line.in_legend}
    labels |= {f.status for p in figure.panels for f in p.failed}
    labels |= {r.label for p in figure.panels for r in p.refs}
    columns = max(1, min(4, 2 * n))
    width, height = (9.0, 3.0 * n + 0.6) if figure.stacked else (5.6 * n, 4.2)
    fig = _new_figure(width, height + 0.22 * -(-len(labels) // columns))
    shape = (n, 1) if figure.stacked else (1, n)
    axes = fig.subplots(*shape, squeeze=False, sharex=figure.stacked).flat
    handles: dict[str, Any] = {}
    for i, (ax, panel) in enumerate(zip(axes, figure.panels, strict=True)):
        _draw_panel(ax, panel, figure, handles)
        if figure.stacked and i < n - 1:
            ax.set_xlabel("")
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


def _legend_order(key: str) -> tuple[int, str]:
    """Lines first (by label), then references, then failure statuses by severity."""
    kind, _, name = key.partition(":")
    if kind == "status":
        return 2, f"{severity(name):02d}"
    return (1 if kind == "ref" else 0), name


def _line_style(line: Line, rim: int = 0) -> dict[str, Any]:
    """Matplotlib's keywords for a line's look, ``rim`` steps wider (`Line.under`)."""
    hollow = line.marker.endswith("-open")
    return {
        "color": line.colour,
        "linestyle": "none" if line.markers_only else DASH_STYLES[line.dash],
        "lw": 1.6 + 1.5 * rim,
        "marker": MARKERS[line.marker],
        "markersize": line.marker_size + (2.0 if line.markers_only else 1.5) * rim,
        "markerfacecolor": "none" if hollow else line.colour,
        "mew": 1.5 if line.markers_only else 1.0,
    }


def _draw_panel(ax: Axes, panel: Panel, figure: LineFigure, handles: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter, NullLocator

    for line in panel.lines:
        if line.low is not None and line.high is not None and line.x:
            if line.bars:
                below = [max(0.0, y - lo) for y, lo in zip(line.y, line.low, strict=True)]
                above = [max(0.0, hi - y) for y, hi in zip(line.y, line.high, strict=True)]
                ax.errorbar(
                    line.x,
                    line.y,
                    [below, above],
                    fmt="none",
                    ecolor=line.colour,
                    capsize=2,
                    elinewidth=1,
                )
            else:
                ax.fill_between(line.x, line.low, line.high, color=line.colour, alpha=0.18, lw=0)
        rim = min(line.under, MAX_RIMS)
        ax.plot(line.x, line.y, label=line.label, **_line_style(line, rim))
        if line.in_legend:  # the legend shows the plain line, not a widened rim
            plain = Line2D([], [], label=line.label, **_line_style(line))
            handles.setdefault(f"line:{line.label}", plain)
    for ref in panel.refs:
        artist = ax.axhline(ref.y, color="#444444", linestyle="--", lw=1, label=ref.label)
        handles.setdefault(f"ref:{ref.label}", artist)
    for status in sorted({f.status for f in panel.failed}):
        points = [f for f in panel.failed if f.status == status]
        symbol = style_of(status).symbol
        hollow = symbol.endswith("-open")
        ax.scatter(
            [f.x * 2 ** (FAILED_NUDGE * f.slot) for f in points],
            [f.y for f in points],
            marker=MARKERS[symbol],
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
                marker=MARKERS[symbol],
                markersize=7,
                markerfacecolor="none" if hollow else "#555555",
                markeredgecolor="#555555",
                label=f"{status} (colour: its line)",
            ),
        )
    if figure.x.log:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    if figure.x.ticks:
        ax.set_xticks([t for t, _ in figure.x.ticks], [label for _, label in figure.x.ticks])
    if figure.x.limits:
        ax.set_xlim(*figure.x.limits)
    if panel.y_log:
        ax.set_yscale("log")
        if panel.y_ticks:
            ax.set_yticks([t for t, _ in panel.y_ticks], [label for _, label in panel.y_ticks])
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            log_format = _plain_log_formatter()
            ax.yaxis.set_major_formatter(log_format(labelOnlyBase=False))
            ax.yaxis.set_minor_formatter(log_format(labelOnlyBase=False))
    if panel.y_range:
        ax.set_ylim(*panel.y_range)
    elif not panel.from_zero:
        ax.margins(y=0.15)
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
        [to_rgb(style_of(s).colour) if s else (1.0, 1.0, 1.0) for s in row] for row in figure.status
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
    head, sep, tail = figure.title.partition(" (")  # heatmaps are narrow: the why below
    ax.set_title(f"{head}\n({tail}" if sep else figure.title, fontsize=10)
    present = {s for row in figure.status for s in row if s}
    legend = [
        Patch(color=style_of(s).colour, label=s)
        for s in sorted(present, key=lambda s: (severity(s), s))
    ]
    fig.legend(handles=legend, loc="outside lower center", ncols=len(legend) or 1, fontsize=8)
    return fig


def _ink(status: str | None) -> str:
    """Black text on light cells, white on dark ones."""
    from matplotlib.colors import to_rgb

    if status is None:
        return "#777777"
    r, g, b = to_rgb(style_of(status).colour)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
