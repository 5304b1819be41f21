"""What each figure of the report shows, decided from `load_records`' frame.

Per-length figures have one line per (series, world size, variant) and a panel per pass; a
length whose pass did not run ``ok`` is a failed point at the panel's floor, marked by status.
Throughput is the record's own ``tflops``, its band the same from the p20/p80 times. A figure
with nothing to draw is named in `Figures.omitted` with why.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from lcab.plot.data import (
    FailedPoint,
    Heatmap,
    Line,
    LineFigure,
    Panel,
    RefLine,
    log2_axis,
    name_stem,
    seqlen_label,
    severity,
)
from lcab.records.table import throughput_unit
from lcab.report.clocks import clock_figures
from lcab.report.frame import SERIES, VARIANT, finite
from lcab.report.frontier import frontier_figures
from lcab.report.plot_data import Figures, Omitted
from lcab.report.plot_style import PASS_TITLES, SEQLEN_AXIS, LineStyle, Styler, hardware_label

PLOT_PASSES = ("fwd", "bwd")
"""Passes drawn as panels (fwd_bwd is their sum; the tables have it)."""


@dataclass(frozen=True)
class Metric:
    """A per-pass value drawn against length, one figure per mask (its page section)."""

    section: str
    """`lcab.report.plot_data.SECTIONS` key, also the stem of the figure names."""
    suffix: str
    """Record column after ``<pass>_``."""
    y_label: str
    y_log: bool
    title: str
    """Figure title; ``{mask}`` is replaced."""
    missing: str
    """Why a mask has no figure; ``{mask}`` is replaced."""
    value_statuses: frozenset[str] = frozenset({"ok"})
    """Pass statuses whose value is drawn; other statuses are failed points."""
    scale: float = 1.0
    """Factor from the record's unit to the axis's (1000: TFLOP/s drawn as GFLOP/s)."""


THROUGHPUT = Metric(
    "throughput",
    "tflops",
    "TFLOP/s per device",
    y_log=False,
    title="Throughput vs sequence length: {mask} (line: p50, band: p20–p80)",
    missing="{mask}: no length ran ok",
)
MEMORY = Metric(
    "memory",
    "mem_peak_mib",
    "peak memory per device (MiB)",
    y_log=True,
    title="Peak memory vs sequence length: {mask}",
    missing="{mask}: no peak memory recorded (bench.memory off, or nothing ran ok)",
)
NUMERICS = Metric(
    "numerics",
    "max_abs_err",
    "max abs error vs fp64 reference",
    y_log=True,
    title="Numerical error vs sequence length: {mask} (dashed: tolerance)",
    missing="{mask}: no numerical error recorded (bench.check_numerics off, or nothing ran)",
    # a mismatching pass still has its error: that value is the point of this figure
    value_statuses=frozenset({"ok", "numerics_mismatch"}),
)


def throughput_metric(frame: pd.DataFrame) -> Metric:
    """`THROUGHPUT` in the machine's units (`throughput_unit`): GFLOP/s where all ran on a CPU."""
    unit, factor = throughput_unit(frame["device"])
    return replace(THROUGHPUT, y_label=f"{unit} per device", scale=factor)


def tflops_band(row: pd.Series, pass_: str) -> tuple[float, float] | None:
    """The p20–p80 TFLOP/s band of a pass, as `lcab.bench.results.summarise` computes TFLOP/s.

    The p80 time gives the low end; the band is widened to hold ``tflops`` (with several mask
    samples that is a median of per-sample values, which may fall outside).
    """
    flops, world = row.get(f"{pass_}_flops"), row.get("world_size") or 1
    p20, p80 = row.get(f"{pass_}_ms_p20"), row.get(f"{pass_}_ms_p80")
    if None in (finite(flops), finite(p20), finite(p80)) or p20 <= 0 or p80 <= 0:
        return None
    low, high = flops / (world * p80 * 1e9), flops / (world * p20 * 1e9)
    mid = row.get(f"{pass_}_tflops")
    if finite(mid) is not None:
        low, high = min(low, mid), max(high, mid)
    return low, high


LINE_KEY = [SERIES, "world_size", VARIANT]


def _reason(row: pd.Series, pass_: str) -> str:
    reason = row.get(f"{pass_}_reason") or row.get("error_msg")
    if not reason and row.get("reasons"):
        reason = "; ".join(row["reasons"])
    return str(reason or "no reason recorded")[:300]


def _hover(row: pd.Series, y_label: str, y: float, band: tuple[float, float] | None) -> str:
    lines = [f"S = {seqlen_label(row['seqlen'])} ({int(row['seqlen']):,} tokens)"]
    if int(row["world_size"]) > 1:
        lines.append(f"world size {int(row['world_size'])}")
    lines.append(f"{y_label}: {y:.4g}")
    if band is not None:
        lines.append(f"p20–p80: {band[0]:.4g} – {band[1]:.4g}")
    return "\n".join(lines)


def _floor(lines: list[Line], refs: list[RefLine], log: bool) -> float:
    """Where failed points sit: 0 on a linear axis, half the smallest value on a log one."""
    if not log:
        return 0.0
    values = [v for line in lines for v in line.y if v > 0] + [r.y for r in refs if r.y > 0]
    return min(values) / 2 if values else 1.0


def metric_panel(
    frame: pd.DataFrame,
    styler: Styler,
    pass_: str,
    metric: Metric,
    x_column: str = "seqlen",
    refs: tuple[RefLine, ...] = (),
) -> Panel:
    """One pass's panel of ``metric`` against ``x_column``: lines and failed points."""
    by_world = x_column != "world_size"
    lines: list[Line] = []
    failures: list[tuple[float, str, LineStyle, str]] = []
    group_by = LINE_KEY if by_world else [SERIES, VARIANT]
    for key, rows in frame.groupby(group_by, sort=True):
        parts = dict(zip(group_by, key, strict=True))
        world = int(parts["world_size"]) if by_world else None
        cp = bool((rows["cp"] != "none").any())
        style = styler.line(str(parts[SERIES]), world, str(parts[VARIANT]), cp)
        xs, ys, bands, hover = [], [], [], []
        for _, row in rows.sort_values(x_column).iterrows():
            if pass_ not in (row["passes"] or []):
                continue  # not asked for: neither a value nor a failure
            status, y = row[f"{pass_}_status"], row.get(f"{pass_}_{metric.suffix}")
            if status not in metric.value_statuses:
                where = f"S = {seqlen_label(row['seqlen'])}, world size {int(row['world_size'])}"
                why = f"{where}: {_reason(row, pass_)}"
                failures.append((float(row[x_column]), str(status), style, why))
            elif finite(y) is not None and (y > 0 or not metric.y_log):
                band = tflops_band(row, pass_) if metric.suffix == "tflops" else None
                band = None if band is None else (band[0] * metric.scale, band[1] * metric.scale)
                y *= metric.scale
                xs.append(float(row[x_column]))
                ys.append(float(y))
                bands.append(band)
                hover.append(_hover(row, metric.y_label, float(y), band))
        if not xs and not any(f[2] is style for f in failures):
            continue  # nothing asked of this line in this pass
        banded = any(b is not None for b in bands)
        lines.append(
            style.draw(
                xs,
                ys,
                low=tuple(b[0] if b else math.nan for b in bands) if banded else None,
                high=tuple(b[1] if b else math.nan for b in bands) if banded else None,
                hover=tuple(hover),
            )
        )
    floor = _floor(lines, list(refs), metric.y_log)
    at_x = Counter(x for x, *_ in failures)
    seen: Counter[float] = Counter()
    failed = []
    for x, status, s, why in failures:
        slot = seen[x] - (at_x[x] - 1) / 2
        seen[x] += 1
        failed.append(FailedPoint(x, floor, status, s.series, s.label, s.colour, why, slot))
    return Panel(
        PASS_TITLES[pass_],
        metric.y_label,
        metric.y_log,
        stacked(lines),
        tuple(failed),
        refs,
    )


def stacked(lines: list[Line]) -> tuple[Line, ...]:
    """``lines`` with `Line.under` set: how many later lines lie exactly on each one."""

    def same(a: Line, b: Line) -> bool:
        return (
            bool(a.x)
            and a.x == b.x
            and a.markers_only == b.markers_only
            and all(math.isclose(u, v, rel_tol=1e-9) for u, v in zip(a.y, b.y, strict=True))
        )

    return tuple(
        replace(line, under=sum(same(line, later) for later in lines[i + 1 :]))
        for i, line in enumerate(lines)
    )


def _passes_of(frame: pd.DataFrame) -> list[str]:
    asked = {p for passes in frame["passes"] for p in (passes or [])}
    return [p for p in PLOT_PASSES if p in asked]


def per_length_figure(
    frame: pd.DataFrame, styler: Styler, metric: Metric, mask: str
) -> LineFigure | None:
    """``metric`` against length for one mask's rows, a panel per pass; None if no values."""
    refs: tuple[RefLine, ...] = ()
    if metric is NUMERICS:
        tolerances = sorted(set(frame["numerics_tolerance"].dropna()))
        refs = tuple(RefLine(float(t), f"tolerance {t:g}") for t in tolerances)
    panels = [metric_panel(frame, styler, p, metric, refs=refs) for p in _passes_of(frame)]
    if not any(panel.has_values for panel in panels):
        return None
    name, title = f"{metric.section}_{name_stem(mask)}", metric.title.format(mask=mask)
    title = " · ".join(t for t in (title, hardware_label(frame)) if t)
    return LineFigure(
        name, metric.section, title, log2_axis(SEQLEN_AXIS, frame["seqlen"]), tuple(panels)
    )


def scaling_figure(
    frame: pd.DataFrame, styler: Styler, mask: str, name: str, section: str
) -> LineFigure | None:
    """Per-device TFLOP/s against world size for one mask's CP rows, at one length.

    The largest length every series has a record for, so each strategy shows a point or a
    failure there; with none common, the largest.
    """
    per_series = [set(s) for _, s in frame.groupby(SERIES)["seqlen"]]
    common = set.intersection(*per_series) if per_series else set()
    seqlen = int(max(common) if common else frame["seqlen"].max())
    rows = frame[frame["seqlen"] == seqlen]
    throughput = throughput_metric(rows)
    panels = [metric_panel(rows, styler, p, throughput, "world_size") for p in _passes_of(rows)]
    if not any(panel.has_values for panel in panels):
        return None
    which = "the largest length in every strategy's records" if common else "the largest length"
    title = f"Per-device throughput vs world size: {mask}, S = {seqlen_label(seqlen)} ({which})"
    title = " · ".join(t for t in (title, hardware_label(rows)) if t)
    axis = log2_axis("world size (ranks, log2 scale)", rows["world_size"], seqlens=False)
    return LineFigure(name, section, title, axis, tuple(panels))


def cp_figure(
    frame: pd.DataFrame, styler: Styler, name: str, section: str, title: str
) -> LineFigure | None:
    """CP load imbalance and communication volume (measured, analytic) against length."""
    imbalance: list[Line] = []
    comm: list[Line] = []
    for key, rows in frame.groupby(LINE_KEY, sort=True):
        style = styler.line(str(key[0]), int(key[1]), str(key[2]), cp=True)
        rows = rows.sort_values("seqlen")
        imbalance += _column_line(rows, "balance_imbalance", 1.0, style)
        comm += _column_line(rows, "comm_bytes_measured", 2.0**-20, style)
        comm += _column_line(rows, "comm_bytes_analytic", 2.0**-20, style, " analytic", True)
    panels = []
    if imbalance:
        # imbalance is >= 1 by definition; a fixed span keeps a perfect 1.0 off the frame edge
        top = max(y for line in imbalance for y in line.y)
        panel = Panel(
            "load imbalance (1 = balanced)",
            "max / mean attended area over ranks",
            False,
            stacked(imbalance),
            y_range=(0.95, max(1.25, top * 1.05)),
        )
        panels.append(panel)
    if comm:
        what = "communication (line: measured, ×: analytic)"
        panels.append(Panel(what, "bytes sent per rank, fwd+bwd (MiB)", True, stacked(comm)))
    if not panels:
        return None
    return LineFigure(name, section, title, log2_axis(SEQLEN_AXIS, frame["seqlen"]), tuple(panels))


def _column_line(
    rows: pd.DataFrame,
    column: str,
    scale: float,
    style: LineStyle,
    suffix: str = "",
    markers_only: bool = False,
) -> list[Line]:
    """A line of one record column against length (rows without a positive value dropped)."""
    points = [
        (float(r["seqlen"]), float(r[column]) * scale)
        for _, r in rows.iterrows()
        if (finite(r.get(column)) or 0) > 0
    ]
    if not points:
        return []
    label = style.label + suffix
    hover = tuple(f"S = {seqlen_label(x)}\n{label}: {y:.4g}" for x, y in points)
    return [
        style.draw(
            (p[0] for p in points),
            (p[1] for p in points),
            label=label,
            markers_only=markers_only,
            hover=hover,
            in_legend=not markers_only,
        )
    ]


def support_heatmap(frame: pd.DataFrame, name: str, title: str, row_label: str) -> Heatmap:
    """Series x masks coloured by the worst record status, annotated with status counts.

    Passes that did not run in otherwise ``ok`` records (no backward on CPU, say) are noted
    in the cell too, since the record status alone would hide them.
    """
    rows = tuple(sorted(frame[SERIES].unique()))
    columns = tuple(sorted(frame["mask"].unique()))
    statuses, texts = [], []
    for series in rows:
        status_row: list[str | None] = []
        text_row: list[str] = []
        for mask in columns:
            cell = frame[(frame[SERIES] == series) & (frame["mask"] == mask)]
            if cell.empty:
                status_row.append(None)
                text_row.append("no records")
                continue
            counts = Counter(cell["status"])
            status_row.append(max(counts, key=severity))
            lines = [f"{n} {s}" for s, n in sorted(counts.items(), key=lambda i: severity(i[0]))]
            lines += _pass_notes(cell[cell["status"] == "ok"])
            text_row.append("\n".join(lines))
        statuses.append(tuple(status_row))
        texts.append(tuple(text_row))
    return Heatmap(
        name, "support", title, row_label, "mask", rows, columns, tuple(statuses), tuple(texts)
    )


def _pass_notes(ok_rows: pd.DataFrame) -> list[str]:
    notes: Counter[str] = Counter()
    for _, row in ok_rows.iterrows():
        for p in row["passes"] or []:
            status = row.get(f"{p}_status")
            if status and status != "ok":
                notes[f"{p} {status}"] += 1
    return [f"({note}: {n})" for note, n in sorted(notes.items())]


def build_figures(frame: pd.DataFrame) -> Figures:
    """Every figure the records allow, in page order, and what was left out and why."""
    styler = Styler(frame)
    out = Figures(colours=dict(styler.colours))
    single, cp = frame[frame["cp"] == "none"], frame[frame["cp"] != "none"]
    masks = sorted(frame["mask"].unique())

    def add(figure: Any, section: str, why: str) -> None:
        if figure is None:
            out.omitted.append(Omitted(section, why))
        else:
            out.figures.append(figure)

    for rows, name, what, row_label in (
        (single, "support_kernels", "kernel", "kernel (cp=none)"),
        (cp, "support_strategies", "strategy", "strategy (cp/kernel)"),
    ):
        title = f"Support by {what} × mask (colour: worst status over lengths and world sizes)"
        heatmap = support_heatmap(rows, name, title, row_label) if len(rows) else None
        kind = "CP" if what == "strategy" else "cp=none"
        add(heatmap, "support", f"{what} × mask: no {kind} records")
    for metric in (throughput_metric(frame), MEMORY, NUMERICS):
        for mask in masks:
            figure = per_length_figure(frame[frame["mask"] == mask], styler, metric, mask)
            add(figure, metric.section, metric.missing.format(mask=mask))
    if cp.empty:
        out.omitted += [Omitted(s, "no CP records (cp != none)") for s in ("scaling", "cp")]
    for mask in sorted(cp["mask"].unique()):
        rows = cp[cp["mask"] == mask]
        figure = scaling_figure(rows, styler, mask, f"scaling_{name_stem(mask)}", "scaling")
        add(figure, "scaling", f"{mask}: no CP length ran ok")
        title = f"CP load balance and communication vs sequence length: {mask}"
        figure = cp_figure(rows, styler, f"cp_{name_stem(mask)}", "cp", title)
        add(figure, "cp", f"{mask}: no imbalance or communication recorded")
    for section_figures, left_out in (
        clock_figures(frame, styler),
        frontier_figures(frame, styler),
    ):
        out.figures += section_figures
        out.omitted += left_out
    return out
