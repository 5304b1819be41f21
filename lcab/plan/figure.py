"""The planner's plot: predicted per-GPU TFLOP/s against world size, one line per strategy.

Measured points of the same masks and strategies are crosses on the same axes (records whose
ranks shared a GPU are no measurement and are left out); drawn by the report's `lcab.plot.png`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lcab.plot.data import Axis, Line, LineFigure, Panel, log2_range, log2_ticks
from lcab.records.schema import RunRecord
from lcab.records.sinks import read_records


def measured_points(
    records: list[RunRecord], mask: str, cp: str, pass_: str
) -> list[tuple[int, float]]:
    """(world size, TFLOP/s per GPU) of the ``ok``, measured records of a mask and strategy."""
    return [
        (r.world_size, tflops)
        for r in records
        if (r.mask, r.cp, r.status) == (mask, cp, "ok")
        and r.timings_measured
        and (tflops := r.pass_result(pass_).tflops)
    ]


def scaling_figure(
    rows: list[dict[str, Any]], records: list[RunRecord], pass_: str = "fwd"
) -> LineFigure:
    """A panel per mask of ``rows`` (`CellPrediction.row` dicts), with ``records`` measured."""
    from matplotlib.colors import TABLEAU_COLORS  # matplotlib's own cycle, as before

    strategies = sorted({r["cp"] for r in rows})
    colours = dict(zip(strategies, [*TABLEAU_COLORS.values()] * len(strategies), strict=False))
    panels = []
    for mask in sorted({r["mask"] for r in rows}):
        lines = []
        for cp in sorted({r["cp"] for r in rows if r["mask"] == mask}):
            ours = sorted(
                (r["world"], r[f"{pass_}_tflops"])
                for r in rows
                if (r["mask"], r["cp"]) == (mask, cp)
            )
            theirs = sorted(measured_points(records, mask, cp, pass_))
            for label, points, only in (
                (f"{cp} (predicted)", ours, False),
                (f"{cp} (measured)", theirs, True),
            ):
                if points:
                    x, y = zip(*points, strict=True)
                    lines.append(Line(label, cp, colours[cp], "solid", x, y, markers_only=only))
        panels.append(Panel(f"{mask}, {pass_}", "TFLOP/s per GPU", False, tuple(lines)))
    worlds = [x for p in panels for line in p.lines for x in line.x]
    axis = Axis(
        "GPUs (world size, log2 scale)", log2_ticks(worlds, label=False), log2_range(worlds)
    )
    measured = any(line.markers_only for p in panels for line in p.lines)
    crosses = "; crosses: measured" if measured else ""
    title = f"Predicted per-GPU throughput vs world size ({pass_}{crosses})"
    return LineFigure("plan_scaling", "plan", title, axis, tuple(panels))


def plot_scaling(
    rows: list[dict[str, Any]], path: Path, records: str | None = None, pass_: str = "fwd"
) -> Path:
    """Write the plot of ``rows`` (`CellPrediction.row` dicts) to ``path``; return it."""
    from lcab.plot.png import render_png

    measured = read_records(Path(records)) if records else []
    path.parent.mkdir(parents=True, exist_ok=True)
    return render_png(scaling_figure(rows, measured, pass_), path, dpi=120)
