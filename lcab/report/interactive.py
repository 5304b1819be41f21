"""The plotly renderer: the report's figures as interactive plots for the HTML page.

It draws the same `lcab.report.plot_data` figures as the PNG renderer, with the same colours,
dashes and status markers, and adds hover text (the numbers, the band, why a length failed).
The page inlines plotly.js once (`plotly_js`); each figure is a ``<div>`` plus the script that
draws it (`figure_div`), so the page works offline. plotly is imported inside the functions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from lcab.report.plot_data import FigureData, Heatmap, Line, LineFigure, Panel, TimeFigure
from lcab.report.plot_style import (
    EVENT_COLOUR,
    EVENT_MARKERS,
    PASS_MARKERS,
    STATUS_SEVERITY,
    severity,
    status_style,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
FAILED_NUDGE = 0.07
"""Octaves between failed points of different lines at one x (as in the PNGs)."""
PANEL_HEIGHT = 470
TIME_PANEL_HEIGHT = 330
"""Pixels per stacked panel of a time figure."""
MAX_RIMS = 4
"""At most this many steps wider for a line covered by later ones (`Line.under`)."""


def plotly_js() -> str:
    """The plotly.js library, to inline once in the page (no CDN: the page works offline)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def figure_div(figure: FigureData) -> str:
    """``figure`` as an HTML ``<div>`` and the script drawing it (plotly.js not included)."""
    import plotly.io as pio

    fig = to_plotly(figure)
    return str(
        pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            div_id=f"plot-{figure.name}",
            config=PLOT_CONFIG,
        )
    )


def to_plotly(figure: FigureData) -> go.Figure:
    """The plotly figure of ``figure``."""
    if isinstance(figure, Heatmap):
        return _heatmap(figure)
    if isinstance(figure, TimeFigure):
        return _time_figure(figure)
    return _line_figure(figure)


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("\n", "<br>")


def _line_figure(figure: LineFigure) -> go.Figure:
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=len(figure.panels),
        subplot_titles=[p.title for p in figure.panels],
        horizontal_spacing=0.09,
    )
    shown: set[str] = set()
    for col, panel in enumerate(figure.panels, 1):
        for trace in _panel_traces(panel, figure, shown):
            fig.add_trace(trace, row=1, col=col)
        limits = figure.x.limits
        fig.update_xaxes(
            type="log",
            tickvals=[t for t, _ in figure.x.ticks],
            ticktext=[label for _, label in figure.x.ticks],
            range=[math.log10(limits[0]), math.log10(limits[1])] if limits else None,
            title_text=figure.x.label,
            row=1,
            col=col,
        )
        y_range = panel.y_range
        if y_range and panel.y_log:
            y_range = (math.log10(y_range[0]), math.log10(y_range[1]))
        fig.update_yaxes(
            type="log" if panel.y_log else "linear",
            # failed points sit at 0: "normal" leaves room so they clear the tick labels
            rangemode="normal" if panel.y_log or panel.failed else "tozero",
            range=list(y_range) if y_range else None,
            title_text=panel.y_label,
            tickvals=[t for t, _ in panel.y_ticks] or None,
            ticktext=[label for _, label in panel.y_ticks] or None,
            row=1,
            col=col,
        )
    fig.update_layout(
        title={"text": figure.title, "x": 0.01},
        height=PANEL_HEIGHT,
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
        if line.low is not None and line.high is not None:
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
                hovertext=[_html(h) for h in line.hover],
                hovertemplate="%{hovertext}<extra>" + _html(line.label) + "</extra>",
            )
        )
    limits = figure.x.limits or (min(figure.x.ticks)[0], max(figure.x.ticks)[0])
    for ref in panel.refs:
        traces.append(
            go.Scatter(
                x=list(limits),
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
        look = status_style(status)
        traces.append(
            go.Scatter(
                x=[f.x * 2 ** (FAILED_NUDGE * f.slot) for f in points],
                y=[f.y for f in points],
                mode="markers",
                name=f"{status} (colour: its line)",
                legendgroup=f"status:{status}",
                showlegend=first(f"status:{status}"),
                marker={
                    "symbol": look.plotly_symbol,
                    "size": 10,
                    "color": [f.colour for f in points],
                    "line": {"color": [f.colour for f in points], "width": 1.5},
                },
                cliponaxis=False,
                hovertext=[_html(f"{f.label}: {f.status}\n{_wrap(f.reason)}") for f in points],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    return traces


def _marker(line: Line, extra: float = 0) -> dict[str, Any]:
    """Point markers of a line (crosses for marker-only lines), ``extra`` px larger."""
    if line.markers_only:
        return {
            "symbol": "x-thin-open",
            "size": 9 + extra,
            "color": line.colour,
            "line": {"color": line.colour, "width": 2 + extra / 3},
        }
    return {"color": line.colour, "size": 6 + extra}


def _label_then_pass(item: tuple[tuple[str, str], Any]) -> tuple[str, int]:
    """Legend order of a time figure's traces: by series label, then fwd, bwd, fwd_bwd."""
    (label, pass_), _ = item
    return label, list(PASS_MARKERS).index(pass_)


def _wrap(text: str, width: int = 80) -> str:
    """Hover text broken into lines of about ``width`` characters."""
    words, lines, current = text.split(), [], ""
    for word in words:
        if current and len(current) + len(word) + 1 > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    return "\n".join([*lines, current])


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
    present = sorted({s for row in figure.status for s in row if s}, key=severity)
    for status in present:
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


def _time_figure(figure: TimeFigure) -> go.Figure:
    """A `TimeFigure`: stacked panels over one time axis.

    A trace per (series, pass), a ring trace per set of clock-event reasons (named in the
    legend; each point's own readings in its hover).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=len(figure.panels),
        cols=1,
        shared_xaxes=True,
        subplot_titles=[p.title for p in figure.panels],
        vertical_spacing=0.12,
    )
    shown: set[str] = set()
    rings = {e: EVENT_MARKERS[i % len(EVENT_MARKERS)] for i, e in enumerate(figure.event_sets)}
    for row, panel in enumerate(figure.panels, 1):
        groups: dict[tuple[str, str], list[Any]] = {}
        for point in panel.points:
            groups.setdefault((point.label, point.pass_name), []).append(point)
        for (label, pass_), group in sorted(groups.items(), key=_label_then_pass):
            name = f"{label} · {pass_}"
            barred = any(p.low is not None and p.high is not None for p in group)
            error_y = (
                {
                    "type": "data",
                    "symmetric": False,
                    "array": [0.0 if p.high is None else p.high - p.y for p in group],
                    "arrayminus": [0.0 if p.low is None else p.y - p.low for p in group],
                    "color": group[0].colour,
                    "thickness": 1,
                    "width": 3,
                }
                if barred
                else None
            )
            fig.add_trace(
                go.Scatter(
                    x=[figure.drawn_x(p) for p in group],
                    y=[p.y for p in group],
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=name not in shown,
                    marker={"symbol": PASS_MARKERS[pass_][1], "color": group[0].colour, "size": 8},
                    error_y=error_y,
                    hovertext=[_html(p.hover) for p in group],
                    hovertemplate="%{hovertext}<extra>" + _html(label) + "</extra>",
                ),
                row=row,
                col=1,
            )
            shown.add(name)
        for events, (_, symbol) in rings.items():
            flagged = [p for p in panel.points if p.events == events]
            if not flagged:
                continue
            name = f"clock events: {', '.join(events)}"
            fig.add_trace(
                go.Scatter(
                    x=[figure.drawn_x(p) for p in flagged],
                    y=[p.y for p in flagged],
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=name not in shown,
                    marker={
                        "symbol": symbol,
                        "size": 17,
                        "color": EVENT_COLOUR,
                        "line": {"width": 1.5},
                    },
                    hovertext=[_html(f"{p.label}: {p.hover}") for p in flagged],
                    hovertemplate="%{hovertext}<extra>" + _html(name) + "</extra>",
                ),
                row=row,
                col=1,
            )
            shown.add(name)
        fig.update_yaxes(title_text=panel.y_label, row=row, col=1)
    fig.update_xaxes(title_text=figure.x_label, row=len(figure.panels), col=1)
    fig.update_layout(
        title={"text": figure.title, "x": 0.01},
        height=TIME_PANEL_HEIGHT * len(figure.panels) + 120,
        template="plotly_white",
        hovermode="closest",
        legend={"orientation": "v", "x": 1.02, "y": 1, "font": {"size": 11}},
        margin={"l": 60, "r": 20, "t": 80, "b": 60},
    )
    return fig
