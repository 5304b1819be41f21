"""The memory frontier in the report: how long a context fits, measured and as the planner has it.

A ``seqlen=frontier`` cell (`lcab.bench.frontier`) ends in one record with the longest length
that ran, its bracket, probes, peak memory and the planner's frontier (`lcab.plan.frontier`).
The figure puts tokens per device against world size, measured (solid) beside the planner's
(dashed); the table lists every search. Ordinary sweeps have neither, and no section.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import pandas as pd

from lcab.plot.data import (
    Line,
    LineFigure,
    Panel,
    log2_axis,
    name_stem,
    seqlen_label,
)
from lcab.report.frame import SERIES, VARIANT
from lcab.report.plot_data import Omitted
from lcab.report.plot_style import Styler, hardware_label

SECTION = "frontier"
PLANNER_DASHES = {"solid": "dash", "dash": "dot", "dot": "dashdot", "dashdot": "dash"}
"""The planner's line beside a measured line of each dash (`lcab.plot.data.DASHES`)."""

TABLE_COLUMNS = {
    "kernel": "kernel",
    "cp": "cp",
    "mask": "mask",
    "world_size": "ranks",
    "frontier_tokens": "frontier (tokens)",
    "frontier_tokens_per_device": "per device",
    "bracket": "bracket (fits – fails)",
    "probes": "probes",
    "frontier_peak_mib": "peak MiB",
    "frontier_bytes_per_token": "bytes / token",
    "frontier_budget_gib": "budget GiB",
    "frontier_predicted_tokens": "planner (tokens)",
    "frontier_predicted_ratio": "measured / planner",
}
"""The table's columns: record column (or one made here) -> heading."""


def frontier_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The records that end a frontier search (empty: none)."""
    if "frontier_tokens" not in frame.columns:
        return frame.iloc[0:0]
    return frame[frame["frontier_tokens"].map(_positive)]


def frontier_table(frame: pd.DataFrame) -> pd.DataFrame | None:
    """One row per frontier record, largest world last within a mask (None: no frontier)."""
    rows = frontier_rows(frame)
    if rows.empty:
        return None
    rows = rows.sort_values(["mask", "kernel", "cp", "world_size"])
    table = pd.DataFrame(
        {
            column: _column(rows, column)
            for column in TABLE_COLUMNS
            if column in ("bracket", "probes") or column in rows.columns
        }
    )
    return table.rename(columns=TABLE_COLUMNS).reset_index(drop=True)


def frontier_figures(frame: pd.DataFrame, styler: Styler) -> tuple[list[LineFigure], list[Omitted]]:
    """One figure per mask with frontier records, and what was left out (both empty: none)."""
    rows = frontier_rows(frame)
    figures: list[LineFigure] = []
    omitted: list[Omitted] = []
    for mask, of_mask in rows.groupby("mask", sort=True):
        lines = _lines(of_mask, styler)
        if not lines:
            omitted.append(Omitted(SECTION, f"{mask}: no frontier with a world size"))
            continue
        axis = log2_axis("ranks (log2 scale)", of_mask["world_size"], seqlens=False)
        panel = Panel(
            "longest length that ran (measured: solid or ×; the planner's model: dashed)",
            "tokens per device",
            True,
            tuple(lines),
        )
        title = f"Memory frontier vs ranks: {mask}"
        budgets = sorted({float(b) for b in of_mask.get("frontier_budget_gib", []) if _positive(b)})
        if budgets:
            title += " · budget " + ", ".join(f"{b:g} GiB" for b in budgets) + " per device"
        title = " · ".join(t for t in (title, hardware_label(of_mask)) if t)
        figures.append(
            LineFigure(f"frontier_{name_stem(str(mask))}", SECTION, title, axis, (panel,))
        )
    return figures, omitted


def _lines(rows: pd.DataFrame, styler: Styler) -> list[Line]:
    """Measured and planned tokens per device against ranks, one pair of lines per series."""
    lines: list[Line] = []
    for (series, variant), of_series in rows.groupby([SERIES, VARIANT], sort=True):
        of_series = of_series.sort_values("world_size")
        cp = any(str(c) != "none" for c in of_series["cp"])
        style = styler.line(str(series), None, str(variant), cp)
        measured = [
            (float(r["world_size"]), float(r["frontier_tokens"]) / float(r["world_size"]), r)
            for _, r in of_series.iterrows()
            if _positive(r.get("world_size"))
        ]
        planned = [
            (x, float(r["frontier_predicted_tokens"]) / x, r)
            for x, _, r in measured
            if _positive(r.get("frontier_predicted_tokens"))
        ]
        for points, suffix, dash in (
            (measured, "", style.dash),
            (planned, " (planner)", PLANNER_DASHES[style.dash]),
        ):
            if not points:
                continue
            label = style.label + suffix
            lines.append(
                style.draw(
                    (x for x, _, _ in points),
                    (y for _, y, _ in points),
                    label=label,
                    dash=dash,
                    markers_only=len(points) == 1 and not suffix,
                    hover=tuple(_hover(label, x, y, r) for x, y, r in points),
                )
            )
    return lines


def _hover(label: str, world: float, per_device: float, row: pd.Series) -> str:
    """What one point says: its series, ranks, tokens, bracket and the planner's ratio."""
    parts = [
        label,
        f"{int(world)} ranks: {seqlen_label(per_device)} tokens per device",
        f"bracket {_bracket(row.get('frontier_bracket'))}",
    ]
    ratio = row.get("frontier_predicted_ratio")
    if _positive(ratio):
        parts.append(f"measured / planner {float(ratio):.2f}")
    return "\n".join(parts)


def _column(rows: pd.DataFrame, column: str) -> list[Any]:
    """A table column: the record's, or the bracket and the probe count made readable."""
    if column == "bracket":
        return [_bracket(b) for b in rows.get("frontier_bracket", [None] * len(rows))]
    if column == "probes":
        probes = rows.get("frontier_probes", [None] * len(rows))
        return [len(p) if isinstance(p, list) else "" for p in probes]
    return [_rounded(v) for v in rows[column]]


def _bracket(bracket: Any) -> str:
    """``[fits, fails]`` as text; an open end (``frontier_max`` reached, nothing ran) as such."""
    if not isinstance(bracket, (list, tuple)) or len(bracket) != 2:
        return ""
    fits, fails = bracket
    return f"{_tokens(fits, 'none ran')} – {_tokens(fails, 'none failed')}"


def _tokens(value: Any, missing: str) -> str:
    return f"{int(value):,}" if _positive(value) else missing


def _rounded(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 3) if abs(value) < 100 else round(value)
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _positive(value: Any) -> bool:
    """A number above zero (not a bool, NaN or a missing value)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    number = float(value)
    return math.isfinite(number) and number > 0
