"""The clock-and-power figure: a sweep's telemetry against the time its lengths ran.

A throughput figure cannot say whether a slow length met a slow clock. Each pass carries its
compute clock (lowest, median, highest), mean power and the driver's clock-event reasons
(`lcab.bench.pass_telemetry`); against when each length began, a GPU reaching its power cap
shows as a sinking clock, and held-back passes are ringed. One figure per sweep with readings;
a CPU sweep at one nominal clock is left out and named (a flat line says nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd

from lcab.flops import PASSES
from lcab.plot.data import EVENT_COLOUR, Axis, Line, LineFigure, Panel, name_stem, seqlen_label
from lcab.report.frame import SERIES, VARIANT, finite
from lcab.report.plot_data import Omitted
from lcab.report.plot_style import PASS_TITLES, LineStyle, Styler

SECTION = "telemetry"
NOT_FLAGGED = frozenset({"GpuIdle"})
"""Clock events that flag no point: the device waited between calls, nothing held it back (the
hover still lists them)."""
X_LABEL = "minutes after the sweep's first record (when each length began)"
PASS_SYMBOLS = {"fwd": "circle", "bwd": "square", "fwd_bwd": "diamond"}
_ORDER = {p: i for i, p in enumerate(PASS_SYMBOLS)}
PASS_NUDGE = {"fwd": -0.006, "bwd": 0.006, "fwd_bwd": 0.0}
"""Offset of each pass's points, as a share of the sweep's time span."""
RINGS = ("circle-open", "diamond-open", "hexagon-open", "pentagon-open", "star-open")
"""Hollow rings around points a clock event flags, one per set of reasons (cycling)."""


def clock_figures(frame: pd.DataFrame, styler: Styler) -> tuple[list[LineFigure], list[Omitted]]:
    """One figure per sweep with clock readings, and those left out with why (none: no section)."""
    if not any(_readings(row) for _, row in frame.iterrows()):
        return [], []
    figures: list[LineFigure] = []
    omitted: list[Omitted] = []
    for sweep, rows in frame.groupby("sweep_id", sort=True, dropna=False):
        name = f"sweep {sweep}" if sweep else "records without a sweep id"
        figure, why = sweep_figure(rows, styler, str(sweep or ""))
        if figure is not None:
            figures.append(figure)
        else:
            omitted.append(Omitted(SECTION, f"{name}: {why}"))
    return figures, omitted


def sweep_figure(rows: pd.DataFrame, styler: Styler, sweep: str) -> tuple[LineFigure | None, str]:
    """The figure of one sweep's rows, or None and why it is not drawn."""
    clocked = [row for _, row in rows.iterrows() if _readings(row)]
    if not clocked:
        return None, "no clock readings (bench.telemetry off)"
    starts = [t for t in (_time(row) for _, row in rows.iterrows()) if t is not None]
    if not starts or all(_time(row) is None for row in clocked):
        return None, "no record says when it ran (created_at)"
    gpu = [_on_gpu(row) for row in clocked]
    values = {v for row in clocked for reading in _readings(row).values() for v in reading}
    if not any(gpu) and len(values) == 1:
        return None, f"every record ran on a CPU at one steady clock ({values.pop():,.0f} MHz)"
    kind = "SM clock" if all(gpu) else "core clock" if not any(gpu) else "compute clock"
    first = min(starts)
    clock_points: list[_Point] = []
    power_points: list[_Point] = []
    for row in sorted(clocked, key=lambda r: (_time(r) or first, int(r["seqlen"]))):
        when = _time(row)
        if when is None:
            continue
        minutes = (when - first).total_seconds() / 60
        cp = str(row["cp"]) != "none"
        style = styler.line(str(row[SERIES]), int(row["world_size"]), str(row[VARIANT]), cp)
        for pass_, (low, median, high) in _readings(row).items():
            events = tuple(e for e in clock_events(row, pass_) if e not in NOT_FLAGGED)
            hover = _hover(row, pass_, minutes, kind)
            clock_points.append(_Point(minutes, pass_, style, median, low, high, events, hover))
            power = finite(row.get(f"{pass_}_power_w"))
            if power is not None:
                power_points.append(_Point(minutes, pass_, style, power, None, None, events, hover))
    found = {p.events for p in clock_points if p.events}
    rings = {
        e: RINGS[i % len(RINGS)] for i, e in enumerate(sorted(found, key=lambda e: (len(e), e)))
    }
    xs = [p.minutes for p in clock_points]
    span = (max(xs) - min(xs)) or 1.0
    panels = [
        _panel(
            f"{kind} per pass (marker: median over the repetitions, bar: lowest–highest)",
            f"{kind} (MHz)",
            clock_points,
            span,
            rings,
        )
    ]
    if power_points:
        what = "mean power per device over the repetitions"
        panels.append(_panel(what, "power (W)", power_points, span, rings))
    what = f"{kind} and power" if power_points else kind
    title = f"{what[0].upper()}{what[1:]} over the sweep: {sweep or 'records'}"
    title = " · ".join(t for t in (title, device_label(pd.DataFrame(clocked))) if t)
    name = f"clocks_{name_stem(sweep)}" if sweep else "clocks"
    axis = Axis(X_LABEL, (), None, log=False)
    return LineFigure(name, SECTION, title, axis, tuple(panels), stacked=True), ""


@dataclass(frozen=True)
class _Point:
    """One pass of one record at the time its length began, with the spread of its reading."""

    minutes: float
    pass_: str
    style: LineStyle
    y: float
    low: float | None
    high: float | None
    events: tuple[str, ...]
    """Clock-event reasons that flag it (`NOT_FLAGGED` left out); empty: not flagged."""
    hover: str


def _panel(
    title: str, y_label: str, points: list[_Point], span: float, rings: dict[tuple[str, ...], str]
) -> Panel:
    """Markers per (series, pass), nudged apart by pass (`PASS_NUDGE`), rings per clock events."""
    groups: dict[tuple[str, str], list[_Point]] = {}
    for point in points:
        groups.setdefault((point.style.label, point.pass_), []).append(point)
    lines = []

    def x(group: list[_Point]) -> tuple[float, ...]:
        return tuple(p.minutes + PASS_NUDGE[p.pass_] * span for p in group)

    for (label, pass_), group in sorted(groups.items(), key=lambda i: (i[0][0], _ORDER[i[0][1]])):
        style, barred = group[0].style, any(p.low is not None for p in group)
        lines.append(
            Line(
                f"{label} · {pass_}",
                style.series,
                style.colour,
                "solid",
                x(group),
                tuple(p.y for p in group),
                tuple(math.nan if p.low is None else p.low for p in group) if barred else None,
                tuple(math.nan if p.high is None else p.high for p in group) if barred else None,
                markers_only=True,
                hover=tuple(p.hover for p in group),
                symbol=PASS_SYMBOLS[pass_],
                bars=True,
                size=5.0,
            )
        )
    for events, symbol in rings.items():
        flagged = [p for p in points if p.events == events]
        if flagged:
            lines.append(
                Line(
                    f"clock events: {', '.join(events)}",
                    "",
                    EVENT_COLOUR,
                    "solid",
                    x(flagged),
                    tuple(p.y for p in flagged),
                    markers_only=True,
                    hover=tuple(f"{p.style.label}: {p.hover}" for p in flagged),
                    symbol=symbol,
                    size=12.0,
                )
            )
    return Panel(title, y_label, False, tuple(lines), from_zero=False)


def device_label(rows: pd.DataFrame) -> str:
    """The readings' device: the telemetry's name, else torch's (``NVIDIA H200 (nvml)``)."""
    names = set()
    for _, row in rows.iterrows():
        name = row.get("telemetry_device") or row.get("device_name") or row.get("device")
        source = row.get("telemetry_source") or row.get("device")
        if name:
            names.add(f"{name} ({source})" if source else str(name))
    if len(names) > 1:
        return f"{len(names)} devices"
    return names.pop() if names else ""


def _readings(row: pd.Series) -> dict[str, tuple[float, float, float]]:
    """Pass -> (lowest, median, highest) clock, for the passes asked of the record that have one.

    A pass with only a median gets it as both ends (no bar).
    """
    out: dict[str, tuple[float, float, float]] = {}
    for pass_ in PASSES:
        if pass_ not in (row.get("passes") or ()):
            continue
        median = finite(row.get(f"{pass_}_clock_mhz_median"))
        if median is None:
            continue
        low = finite(row.get(f"{pass_}_clock_mhz_min"))
        high = finite(row.get(f"{pass_}_clock_mhz_max"))
        out[pass_] = (median if low is None else low, median, median if high is None else high)
    return out


def clock_events(row: pd.Series, pass_: str) -> tuple[str, ...]:
    """The pass's clock-event reasons, as the record lists them (none: empty)."""
    value = row.get(f"{pass_}_clock_events")
    return tuple(str(e) for e in value if e) if isinstance(value, list | tuple) else ()


def implausible(value: Any) -> bool:
    """Whether a ``peak_implausible`` cell is True (a numpy bool in an all-bool column)."""
    return isinstance(value, bool | np.bool_) and bool(value)


def _on_gpu(row: pd.Series) -> bool:
    return row.get("telemetry_source") == "nvml" or row.get("device") == "cuda"


def _time(row: pd.Series) -> datetime | None:
    """When the record's length began (``created_at``); None when missing or unreadable."""
    text = row.get("created_at")
    if not text or not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    # lcab writes UTC; a time without a zone is read as UTC so it sorts beside the others
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _hover(row: pd.Series, pass_: str, minutes: float, kind: str) -> str:
    """Every reading of the pass, for the hover (the same text in both panels)."""
    lines = [f"{PASS_TITLES[pass_]}, S = {seqlen_label(row['seqlen'])} ({int(row['seqlen']):,})"]
    if int(row["world_size"]) > 1:
        lines[0] += f", world size {int(row['world_size'])}"
    lines.append(f"+{minutes:.1f} min ({row['created_at']})")

    def get(field: str) -> float | None:
        return finite(row.get(f"{pass_}_{field}"))

    low, median, high = get("clock_mhz_min"), get("clock_mhz_median"), get("clock_mhz_max")
    text = f"{kind}: {median:,.0f} MHz median"
    if low is not None and high is not None:
        text += f" ({low:,.0f}–{high:,.0f})"
    lines.append(text)
    if (mem := get("mem_clock_mhz")) is not None:
        lines.append(f"memory clock: {mem:,.0f} MHz")
    if (power := get("power_w")) is not None:
        most = get("power_w_max")
        spread = f", highest rank {most:,.0f} W" if most is not None and most != power else ""
        lines.append(f"power: {power:,.0f} W mean{spread}")
    if (temperature := get("temperature_c")) is not None:
        lines.append(f"temperature: {temperature:.0f} °C")
    if (per_token := get("energy_j_per_token")) is not None:
        lines.append(f"energy: {per_token:.3g} J/token")
    if (share := get("peak_share")) is not None:
        lines.append(f"{share:.0%} of the device's peak at this clock")
        if implausible(row.get(f"{pass_}_peak_implausible")):
            lines[-1] += ": above the peak, a FLOP count or timer error"
    if events := clock_events(row, pass_):
        lines.append(f"clock events: {', '.join(events)}")
    return "\n".join(lines)
