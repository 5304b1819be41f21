"""The plotly renderer: `lcab.plot.data` figures as interactive plots for an HTML page.

The same figures as the PNGs, plus hover text. A page inlines plotly.js once (`plotly_js`) and
each figure is a ``<div>`` with its script (`figure_div`), so the page works offline.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Any

from lcab.plot.data import (
    FAILED_NUDGE,
    MAX_RIMS,
    STATUS_SEVERITY,
    FigureData,
    Heatmap,
    Line,
    LineFigure,
    Panel,
    severity,
    status_style,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
PANEL_HEIGHT = 470
STACKED_PANEL_HEIGHT = 330
"""Pixels per panel of a stacked figure."""
PX_PER_POINT = 1.5
"""A marker's size in pixels per point of `Line.marker_size`."""


def plotly_js() -> str:
    """The plotly.js library, to inline once in the page (no CDN: the page works offline)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def figure_div(figure: FigureData) -> str:
    """``figure`` as an HTML ``<div>`` and the script drawing it (plotly.js not included)."""
    import plotly.io as pio

    div_id = f"plot-{figure.name}"
    fig = to_plotly(figure)
    html = pio.to_html(
        fig, full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG
    )
    return str(html)


def to_plotly(figure: FigureData) -> go.Figure:
    """The plotly figure of ``figure``."""
    return _heatmap(figure) if isinstance(figure, Heatmap) else _line_figure(figure)


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("\n", "<br>")


def _line_figure(figure: LineFigure) -> go.Figure:
    from plotly.subplots import make_subplots

    n = len(figure.panels)
    fig = make_subplots(
        rows=n if figure.stacked else 1,
        cols=1 if figure.stacked else n,
        shared_xaxes=figure.stacked,
        subplot_titles=[p.title for p in figure.panels],
        horizontal_spacing=0.09,
        vertical_spacing=0.12,
    )
    shown: set[str] = set()
    limits = figure.x.limits
    if limits and figure.x.log:
        limits = (math.log10(limits[0]), math.log10(limits[1]))
    for i, panel in enumerate(figure.panels, 1):
        where = {"row": i, "col": 1} if figure.stacked else {"row": 1, "col": i}
        for trace in _panel_traces(panel, figure, shown):
            fig.add_trace(trace, **where)
        last = not figure.stacked or i == n
        fig.update_xaxes(
            type="log" if figure.x.log else "linear",
            tickvals=[t for t, _ in figure.x.ticks] or None,
            ticktext=[label for _, label in figure.x.ticks] or None,
            range=list(limits) if limits else None,
            title_text=figure.x.label if last else None,
            **where,
        )
        y_range = panel.y_range
        if y_range and panel.y_log:
            y_range = (math.log10(y_range[0]), math.log10(y_range[1]))
        zero = panel.from_zero and not panel.y_log and not panel.failed
        fig.update_yaxes(
            type="log" if panel.y_log else "linear",
            # failed points sit at 0: "normal" leaves room so they clear the tick labels
            rangemode="tozero" if zero else "normal",
            range=list(y_range) if y_range else None,
            title_text=panel.y_label,
            tickvals=[t for t, _ in panel.y_ticks] or None,
            ticktext=[label for _, label in panel.y_ticks] or None,
            **where,
        )
    fig.update_layout(
        title={"text": figure.title, "x": 0.01},
        height=STACKED_PANEL_HEIGHT * n + 120 if figure.stacked else PANEL_HEIGHT,
        template="plotly_white",
        hovermode="closest",
        legend={"orientation": "v", "x": 1.02, "y": 1, "font": {"size": 11}},
        margin={"l": 60, "r": 20, "t": 80, "b": 60},
    )
    return fig


def _panel_traces(panel: Panel, figure: LineFigure, shown: set[str]) -> list[Any]:
    """Traces of one panel: bands, lines, references, failed points (legend entries once)."""
    import plotly.graph_objects as go

    traces: list[Any] = []

    def first(key: str) -> bool:
        new = key not in shown
        shown.add(key)
        return new

    for line in panel.lines:
        banded = line.low is not None and line.high is not None
        if banded and not line.bars:
            band = {"mode": "lines", "line": {"width": 0}, "hoverinfo": "skip", "showlegend": False}
            traces.append(go.Scatter(x=line.x, y=line.high, legendgroup=line.label, **band))
            traces.append(
                go.Scatter(
                    x=line.x,
                    y=line.low,
                    fill="tonexty",
                    fillcolor=_rgba(line.colour, 0.18),
                    legendgroup=line.label,
                    **band,
                )
            )
        mode = "markers" if line.markers_only else "lines+markers"
        rim = min(line.under, MAX_RIMS)
        if rim:
            # a wider copy underneath, so the line shows as a rim around the ones covering it
            traces.append(
                go.Scatter(
                    x=line.x,
                    y=line.y,
                    mode=mode,
                    legendgroup=line.label,
                    showlegend=False,
                    hoverinfo="skip",
                    line={"color": line.colour, "dash": line.dash, "width": 2 + 2 * rim},
                    marker=_marker(line, extra=3 * rim),
                )
            )
        traces.append(
            go.Scatter(
                # plotly leaves a trace without points out of the legend: one empty point
                x=line.x or [None],
                y=line.y or [None],
                mode=mode,
                name=line.label,
                legendgroup=line.label,
                showlegend=line.in_legend and first(f"line:{line.label}"),
                line={"color": line.colour, "dash": line.dash, "width": 2},
                marker=_marker(line),
                error_y=_bars(line) if banded and line.bars else None,
                hovertext=[_html(h) for h in line.hover],
                hovertemplate="%{hovertext}<extra>" + _html(line.label) + "</extra>",
            )
        )
    for ref in panel.refs:
        ends = figure.x.limits or (figure.x.ticks[0][0], figure.x.ticks[-1][0])
        traces.append(
            go.Scatter(
                x=list(ends),
                y=[ref.y, ref.y],
                mode="lines",
                name=ref.label,
                legendgroup=f"ref:{ref.label}",
                showlegend=first(f"ref:{ref.label}"),
                line={"color": "#444444", "dash": "dash", "width": 1},
                hovertemplate=_html(ref.label) + "<extra></extra>",
            )
        )
    for status in sorted({f.status for f in panel.failed}, key=severity):
        points = [f for f in panel.failed if f.status == status]
        traces.append(
            go.Scatter(
                x=[f.x * 2 ** (FAILED_NUDGE * f.slot) for f in points],
                y=[f.y for f in points],
                mode="markers",
                name=f"{status} (colour: its line)",
                legendgroup=f"status:{status}",
                showlegend=first(f"status:{status}"),
                marker={
                    "symbol": status_style(status).symbol,
                    "size": 10,
                    "color": [f.colour for f in points],
                    "line": {"color": [f.colour for f in points], "width": 1.5},
                },
                cliponaxis=False,
                hovertext=[
                    _html(f"{f.label}: {f.status}\n{textwrap.fill(f.reason, 80)}") for f in points
                ],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    return traces


def _marker(line: Line, extra: float = 0) -> dict[str, Any]:
    """Point markers of a line in its symbol (`Line.marker`), ``extra`` px larger."""
    size = line.marker_size * PX_PER_POINT + extra
    marker: dict[str, Any] = {"symbol": line.marker, "size": size, "color": line.colour}
    if line.markers_only:
        marker["line"] = {"color": line.colour, "width": 2 + extra / 3}
    return marker


def _bars(line: Line) -> dict[str, Any]:
    """A line's ``low``/``high`` as error bars (a missing end: none on that side)."""

    def lengths(ends: tuple[float, ...] | None, sign: float) -> list[float]:
        pairs = zip(line.y, ends or [math.nan] * len(line.y), strict=True)
        return [0.0 if math.isnan(e) else max(0.0, sign * (e - y)) for y, e in pairs]

    return {
        "type": "data",
        "symmetric": False,
        "array": lengths(line.high, 1.0),
        "arrayminus": lengths(line.low, -1.0),
        "color": line.colour,
        "thickness": 1,
        "width": 3,
    }


def _heatmap(figure: Heatmap) -> go.Figure:
    import plotly.graph_objects as go

    palette = [*STATUS_SEVERITY, "unknown"]
    n = len(palette)
    scale: list[list[Any]] = []
    for i, status in enumerate(palette):
        colour = status_style(status).colour
        scale += [[i / n, colour], [(i + 1) / n, colour]]
    z = [[None if s is None else min(severity(s), n - 1) for s in row] for row in figure.status]
    text = [[_html(t) for t in row] for row in figure.text]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(figure.columns),
            y=list(figure.rows),
            text=text,
            texttemplate="%{text}",
            textfont={"size": 11},
            colorscale=scale,
            zmin=-0.5,
            zmax=n - 0.5,
            showscale=False,
            xgap=2,
            ygap=2,
            hovertemplate="%{y} × %{x}<br>%{text}<extra></extra>",
        )
    )
    for status in sorted({s for row in figure.status for s in row if s}, key=severity):
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=status,
                marker={"symbol": "square", "size": 12, "color": status_style(status).colour},
            )
        )
    longest = max((len(t.split("\n")) for row in figure.text for t in row), default=1)
    fig.update_layout(
        title={"text": figure.title, "x": 0.01},
        height=160 + len(figure.rows) * (30 + 16 * longest),
        template="plotly_white",
        xaxis={"title": {"text": figure.column_label}, "side": "bottom"},
        yaxis={"title": {"text": figure.row_label}, "autorange": "reversed"},
        legend={"orientation": "h", "y": -0.15 if len(figure.rows) > 2 else -0.3},
        margin={"l": 60, "r": 20, "t": 60, "b": 60},
    )
    return fig
