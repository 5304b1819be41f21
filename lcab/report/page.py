"""The report's tables and its one-file HTML page.

Two tables come from the records: the summary (one row per cell and length: status, times,
TFLOP/s, memory, numerical error, why it did not run; with telemetry, the share of the device's
peak and the energy per token, and a ``!`` on a TFLOP/s above that peak) and the reasons (why
lengths were skipped or failed, grouped with counts and where they happened). They are written
as CSV and Markdown by `lcab.report.build` and shown on the page below the plots.

The page is a single self-contained file: plotly.js is inlined once in its head and every plot
is a ``<div>`` drawn by a short script, so it opens offline, from a laptop or a cluster's
shared disk, without a server or a CDN.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lcab.flops import PASSES
from lcab.plot.data import severity
from lcab.records.table import throughput_unit
from lcab.report.clocks import implausible
from lcab.report.plot_data import OPTIONAL_SECTIONS, SECTIONS, Figures

SUMMARY_COLUMNS = (
    "mask",
    "series",
    "kernel",
    "cp",
    "world_size",
    "variant",
    "seqlen",
    "status",
    "fwd_ms_p50",
    "fwd_tflops",
    "bwd_ms_p50",
    "bwd_tflops",
    "fwd_predicted_ratio",
    "bwd_predicted_ratio",
    "fwd_mem_peak_mib",
    "bwd_mem_peak_mib",
    "fwd_max_abs_err",
    "bwd_max_abs_err",
    "run_id",
)
"""Record columns of the summary table, in order; a ``reason`` column follows."""
SUMMARY_PASSES = ("fwd", "bwd")
"""Passes whose TFLOP/s the summary shows."""
TELEMETRY_COLUMNS = (
    ("peak_pct", "peak_share", 100.0),
    ("energy_j_per_token", "energy_j_per_token", 1.0),
)
"""(summary column after ``<pass>_``, record field after ``<pass>_``, factor): the share of the
device's peak at the measured clock (in %) and the energy per token (J), after the TFLOP/s
columns, for each pass that has a value in some record (none: no column)."""
ABOVE_PEAK = "above_peak"
"""Summary column naming the passes that ran above their device's peak (only when one did)."""
IMPLAUSIBLE_MARK = "!"
IMPLAUSIBLE_NOTE = (
    f"{IMPLAUSIBLE_MARK} after a throughput: above the device's peak at its clock: FLOP count or "
    "timer error (the reasons give the numbers)"
)
REASON_COLUMNS = ("status", "reason", "passes", "records", "where")
PREDICTION_COLUMNS = (
    "mask",
    "series",
    "world_size",
    "variant",
    "seqlen",
    "pass",
    "measured_ms",
    "predicted_ms",
    "measured_tflops",
    "predicted_tflops",
    "ratio",
    "hardware",
    "flag",
)
"""Measured vs predicted, one row per pass of an ``ok`` record that has a prediction."""
WITHIN = 0.30
"""The planner guide's validation tolerance (±30 %), counted in the table's headline."""
MAX_WHERE = 6
"""Cells named in a reason's ``where`` before "+N more"."""

READING_NOTE = (
    "One colour per kernel (cp=none) or CP strategy/local kernel in every plot; dashes tell a "
    "series' world sizes apart. Lines lying exactly on one another are drawn wider underneath, "
    "so each shows as a rim. Hover a point for its numbers, a marker on the axis for why that "
    "length did not run; click legend entries to hide lines."
)
SECTION_NOTES = {
    "support": "Each cell is one series (kernel, or CP strategy/local kernel) on one mask, "
    "coloured by the worst status of its records; the text counts the statuses.",
    "throughput": "Useful TFLOP/s (GFLOP/s where every record ran on a CPU; per device under "
    "CP) of each pass; the line is the p50 "
    "time's throughput, the band the p20–p80 times'. Lengths that did not run are marked on "
    "the axis by status, in their line's colour (hover for why).",
    "scaling": "Per-device throughput of each CP strategy against the number of ranks, at one "
    "length per mask (named in the title).",
    "memory": "Peak memory of each pass over the timed region (per device under CP).",
    "numerics": "Largest error of each pass against the fp64 reference (normalised), with the "
    "tolerance a pass must meet.",
    "cp": "Load imbalance of the CP plan (max / mean attended area over ranks) and bytes each "
    "rank sends in one forward+backward: measured (line) and analytic (crosses).",
    "compare": "The second named run against the first (report build base=A new=B), cell by "
    "cell: the time ratio new/base with its 95 % interval from the kept repetitions "
    "(Mann–Whitney; in parentheses the p20–p80 band, for records without them) and a verdict; "
    "then what differs between the runs (versions, driver, the kernels' binaries, clocks, "
    "protocol) and the cells of one run only (also compare.csv, compare.md; "
    "python -m lcab.report compare gives the same for any two campaigns).",
    "frontier": "The longest sequence each cell ran without running out of memory "
    "(seqlen=frontier: doubling, then bisection), per device against the number of ranks: "
    "solid the measured frontier, dashed the planner's from its memory model in the same budget. "
    "The table gives every search: its bracket (longest that ran, shortest that ran out), "
    "probes, peak memory and the measured / planner ratio (also frontier.csv, frontier.md).",
    "telemetry": "The compute clock (SM clock on a GPU) of each pass against when its length "
    "began, one figure per sweep: marker the median over the timed repetitions, bar its lowest "
    "to highest, colour the series, shape the pass; below, the mean power per device. A ring "
    "marks a pass the driver held back (power cap, thermal or hardware slowdown; idle waits are "
    "not marked), with its reasons in the legend and every reading in the hover.",
}


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per record: cell, length, status, p50 times, TFLOP/s, memory, errors, reason.

    With telemetry, ``<pass>_peak_pct`` and ``<pass>_energy_j_per_token`` follow the TFLOP/s
    columns (`TELEMETRY_COLUMNS`), and ``above_peak`` names the passes that ran above their
    device's peak; records without telemetry add none of them.
    """
    table = frame[list(SUMMARY_COLUMNS)].copy()
    at = list(table.columns).index("bwd_tflops") + 1
    for column, field, factor in TELEMETRY_COLUMNS:
        for pass_ in SUMMARY_PASSES:
            values = pd.to_numeric(frame[f"{pass_}_{field}"], errors="coerce") * factor
            if field == "peak_share":  # no throughput shown (ranks shared a GPU): no share
                values = values.where(pd.to_numeric(frame[f"{pass_}_tflops"]).notna())
            if values.notna().any():
                table.insert(at, f"{pass_}_{column}", values)
                at += 1
    above = [
        ", ".join(p for p in PASSES if implausible(row.get(f"{p}_peak_implausible")))
        for _, row in frame.iterrows()
    ]
    if any(above):
        table.insert(at, ABOVE_PEAK, above)
    table["reason"] = [_first_reason(row) for _, row in frame.iterrows()]
    return in_machine_units(table.reset_index(drop=True), frame)


def in_machine_units(table: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its ``*_tflops`` columns as ``*_gflops`` when every record ran on a CPU.

    A CPU's 5 GFLOP/s read "0.005"; the console and the figures say GFLOP/s there too
    (`lcab.records.table.throughput_unit`).
    """
    _, factor = throughput_unit(frame["device"])
    if factor == 1.0:
        return table
    named = {
        c: c.removesuffix("_tflops") + "_gflops" for c in table.columns if c.endswith("_tflops")
    }
    out = table.copy()
    for column in named:
        out[column] = pd.to_numeric(out[column]) * factor
    return out.rename(columns=named)


def marked_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The summary to read (Markdown, the page): TFLOP/s above the peak end in ``!``.

    The CSV keeps the numbers, with the passes in ``above_peak``.
    """
    if ABOVE_PEAK not in table.columns:
        return table
    out = table.copy()
    flagged = out[ABOVE_PEAK].map(lambda text: set(str(text).split(", ")))
    for pass_ in SUMMARY_PASSES:
        column = f"{pass_}_tflops" if f"{pass_}_tflops" in out.columns else f"{pass_}_gflops"
        out[column] = [
            format_value(v) + (IMPLAUSIBLE_MARK if pass_ in passes else "")
            for v, passes in zip(out[column], flagged, strict=True)
        ]
    return out


def summary_markdown(table: pd.DataFrame) -> str:
    """``summary.md``: the table (`marked_summary`), and the note when a pass is marked."""
    text = markdown_table(shown_columns(marked_summary(table), keep=("variant", "reason")))
    return text + (f"\n{IMPLAUSIBLE_NOTE}.\n" if ABOVE_PEAK in table.columns else "")


def _first_reason(row: pd.Series) -> str:
    for status, _pass, reason in record_reasons(row):
        if status != "ok":
            return reason
    return ""


def record_reasons(row: pd.Series) -> list[tuple[str, str, str]]:
    """(status, pass or ``cell``, reason) of everything a record says did not run or went wrong.

    Pass reasons (``"bwd: a; b"``) are split into their parts and take the pass's status;
    other reasons (a traceback, "not run: ...") are the record's, cut to their last line.
    """
    out: list[tuple[str, str, str]] = []
    for text in row["reasons"] or []:
        head, sep, rest = str(text).partition(": ")
        if sep and head in PASSES:
            status = str(row.get(f"{head}_status") or row["status"])
            out += [(status, head, part.strip()) for part in rest.split("; ") if part.strip()]
        else:
            out.append((str(row["status"]), "cell", _last_line(str(text))))
    if not out and row["status"] != "ok":
        out.append((str(row["status"]), "cell", str(row.get("error_msg") or "no reason recorded")))
    return out


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else text)[:300]


def reasons_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Why things did not run, grouped by (status, reason): passes, record count, where.

    Sorted worst status first, then by how many records share the reason.
    """
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for index, row in frame.iterrows():
        for status, pass_, reason in record_reasons(row):
            group = groups.setdefault(
                (status, reason), {"passes": set(), "records": set(), "where": set()}
            )
            group["passes"].add(pass_)
            group["records"].add(index)
            group["where"].add(f"{row['series']} × {row['mask']}")
    rows: list[dict[str, Any]] = []
    for (status, reason), group in groups.items():
        where = sorted(group["where"])
        more = len(where) - MAX_WHERE
        rows.append(
            {
                "status": status,
                "reason": reason,
                "passes": ", ".join(p for p in (*PASSES, "cell") if p in group["passes"]),
                "records": len(group["records"]),
                "where": "; ".join(where[:MAX_WHERE]) + (f"; +{more} more" if more > 0 else ""),
            }
        )
    rows.sort(key=lambda r: (-severity(r["status"]), -r["records"], r["reason"]))
    return pd.DataFrame(rows, columns=list(REASON_COLUMNS))


def predictions_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured vs predicted per pass (``ratio`` = measured / predicted throughput).

    ``flag`` repeats the record's warning mark (outside the band of
    ``lcab.plan.record_prediction``); rows are sorted furthest from 1 first.
    """
    rows: list[dict[str, Any]] = []
    for _, row in frame.iterrows():
        for pass_ in PASSES:
            ratio = row.get(f"{pass_}_predicted_ratio")
            if row["status"] != "ok" or ratio is None or pd.isna(ratio):
                continue
            warning = str(row.get("prediction_warning") or "")
            rows.append(
                {
                    **{k: row[k] for k in ("mask", "series", "world_size", "variant", "seqlen")},
                    "pass": pass_,
                    "measured_ms": row[f"{pass_}_ms_p50"],
                    "predicted_ms": row[f"{pass_}_predicted_ms"],
                    "measured_tflops": row[f"{pass_}_tflops"],
                    "predicted_tflops": row[f"{pass_}_predicted_tflops"],
                    "ratio": float(ratio),
                    "hardware": row.get("predicted_hardware"),
                    "flag": "off the plan" if f" {pass_} " in f" {warning} " else "",
                }
            )
    rows.sort(key=lambda r: -abs(math.log(r["ratio"])) if r["ratio"] > 0 else -math.inf)
    return in_machine_units(pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS)), frame)


def predictions_headline(table: pd.DataFrame) -> str:
    """``N of M passes within ±30 % of the planner's prediction; K off the plan``."""
    if not len(table):
        return "No record has a prediction (records from before lcab recorded them)."
    within = int(((table["ratio"] - 1).abs() <= WITHIN).sum())
    flagged = int((table["flag"] != "").sum())
    return (
        f"{within} of {len(table)} passes within ±{WITHIN:.0%} of the planner's prediction; "
        f"{flagged} off the plan (outside the warning band)."
    )


def format_value(value: Any) -> str:
    """A table cell as text: 4 significant digits for floats, ``–`` for missing values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(table: pd.DataFrame, max_text: int = 120) -> str:
    """``table`` as a GitHub Markdown table (long texts cut to ``max_text`` characters)."""

    def cell(value: Any) -> str:
        text = format_value(value).replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= max_text else text[: max_text - 1] + "…"

    lines = [
        "| " + " | ".join(table.columns) + " |",
        "|" + "|".join("---" for _ in table.columns) + "|",
    ]
    lines += [
        "| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)
    ]
    return "\n".join(lines) + "\n"


def shown_columns(table: pd.DataFrame, keep: tuple[str, ...] = ()) -> pd.DataFrame:
    """``table`` without the columns empty in every row (but those in ``keep``)."""
    empty = [
        c
        for c in table.columns
        if c not in keep and table[c].map(lambda v: format_value(v) in ("", "–")).all()
    ]
    return table.drop(columns=empty)


def html_table(table: pd.DataFrame, max_text: int = 160) -> str:
    """``table`` as an escaped HTML table; long texts are cut, in full on hover."""

    def cell(value: Any) -> str:
        text = format_value(value)
        if len(text) <= max_text:
            return f"<td>{html.escape(text)}</td>"
        short = text[: max_text - 1] + "…"
        return f'<td title="{html.escape(text)}">{html.escape(short)}</td>'

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in table.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass(frozen=True)
class PageInputs:
    """What the page shows besides figures: sources, record count, tables, plot divs."""

    sources: Sequence[tuple[str, int]]
    """Each input path with the number of records read from it."""
    num_records: int
    summary: pd.DataFrame
    reasons: pd.DataFrame
    divs: dict[str, str]
    """Figure name -> its ``<div>`` and drawing script (`lcab.plot.html`)."""
    predictions: pd.DataFrame | None = None
    """`predictions_table` (None: no section)."""
    anchors: pd.DataFrame | None = None
    """Published figures beside the records (`lcab.report.anchors`; None: no match, no section)."""
    anchor_sources: Sequence[str] = ()
    """The sources the anchors table cites, one line each."""
    section_tables: dict[str, list[pd.DataFrame]] = dataclasses.field(default_factory=dict)
    """Tables shown under a figure section's figures, by section key (the frontier's, the
    comparison's)."""


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1500px;
       padding: 0 1rem; color: #222; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem;
     margin-top: 2.5rem; }
nav a { margin-right: 1rem; } .note { color: #555; max-width: 70rem; }
.omitted { color: #8a5a00; font-style: italic; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1.5rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.45rem; text-align: left;
         vertical-align: top; }
th { background: #f3f3f3; position: sticky; top: 0; } tr:nth-child(even) { background: #fafafa; }
.plot { margin: 1rem 0 2rem; } .scroll { overflow-x: auto; }
.implausible { color: #b00020; }
"""


def render_page(figures: Figures, inputs: PageInputs, plotly_js: str) -> str:
    """The whole HTML page: sources, plots by section (and what was left out), tables."""
    shown = [
        key
        for key in SECTIONS
        if key not in OPTIONAL_SECTIONS
        or figures.by_section(key)
        or key in inputs.section_tables
        or any(o.section == key for o in figures.omitted)
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>lcab report</title>",
        '<link rel="icon" href="data:,">',
        f"<style>{STYLE}</style>",
        f'<script type="text/javascript">{plotly_js}</script>',
        "</head><body>",
        "<h1>lcab report</h1>",
        f"<p>{inputs.num_records} records from:</p><ul>",
        *(f"<li><code>{html.escape(p)}</code> ({n} records)</li>" for p, n in inputs.sources),
        "</ul>",
        f'<p class="note">{html.escape(READING_NOTE)}</p><nav>',
        *(f'<a href="#{key}">{title}</a>' for key, title in SECTIONS.items() if key in shown),
        '<a href="#summary">Summary table</a><a href="#predicted">Measured vs predicted</a>'
        + ('<a href="#anchors">Published figures</a>' if inputs.anchors is not None else "")
        + '<a href="#reasons">Reasons</a></nav>',
    ]
    for key, title in SECTIONS.items():
        if key not in shown:
            continue
        parts.append(f'<section id="{key}"><h2>{html.escape(title)}</h2>')
        parts.append(f'<p class="note">{html.escape(SECTION_NOTES[key])}</p>')
        for figure in figures.by_section(key):
            parts.append(f'<div class="plot">{inputs.divs[figure.name]}</div>')
        for omitted in (o for o in figures.omitted if o.section == key):
            parts.append(f'<p class="omitted">Not drawn: {html.escape(omitted.why)}.</p>')
        for table in inputs.section_tables.get(key, []):
            parts.append(f'<div class="scroll">{html_table(table)}</div>')
        parts.append("</section>")
    parts += [
        '<section id="summary"><h2>Summary table</h2>',
        '<p class="note">One row per cell and length (also <code>summary.csv</code>, '
        "<code>summary.md</code>). Times are p50 milliseconds, throughput "
        f"{'GFLOP/s' if 'fwd_gflops' in inputs.summary.columns else 'TFLOP/s'} per device, "
        f"memory MiB.{_telemetry_note(inputs.summary)}</p>",
        f'<div class="scroll">{html_table(shown_columns(marked_summary(inputs.summary)))}</div>',
        *(
            [f'<p class="note implausible">{html.escape(IMPLAUSIBLE_NOTE)}.</p>']
            if ABOVE_PEAK in inputs.summary.columns
            else []
        ),
        "</section>",
        *_predicted_section(inputs.predictions),
        *_anchors_section(inputs.anchors, inputs.anchor_sources),
        '<section id="reasons"><h2>Reasons</h2>',
        '<p class="note">Why passes or lengths did not run, or went wrong, grouped with the '
        "number of records (also <code>reasons.csv</code>, <code>reasons.md</code>).</p>",
        html_table(inputs.reasons, max_text=400)
        if len(inputs.reasons)
        else "<p>Every pass ran ok.</p>",
        "</section></body></html>",
    ]
    return "\n".join(parts)


def _telemetry_note(summary: pd.DataFrame) -> str:
    """What the summary's telemetry columns mean (empty: it has none)."""
    notes = []
    if any(c.endswith("_peak_pct") for c in summary.columns):
        notes.append(
            "peak_pct is the share (%) of the device's dense peak for the dtype at the measured "
            "clock"
        )
    if any(c.endswith("_energy_j_per_token") for c in summary.columns):
        notes.append("energy_j_per_token the energy of one call per token (joules)")
    return (" " + "; ".join(notes) + ".") if notes else ""


def _predicted_section(table: pd.DataFrame | None) -> list[str]:
    """The measured-vs-predicted section: its headline, then the table (furthest first)."""
    if table is None:
        return []
    note = (
        "Each record carries the planner's prediction for its own cell on the profile that "
        "matches where it ran; ratio = measured / predicted throughput (also "
        "<code>predicted.csv</code>, <code>predicted.md</code>). "
        + html.escape(predictions_headline(table))
    )
    body = f'<div class="scroll">{html_table(shown_columns(table))}</div>' if len(table) else ""
    return [
        '<section id="predicted"><h2>Measured vs predicted</h2>',
        f'<p class="note">{note}</p>{body}</section>',
    ]


def _anchors_section(table: pd.DataFrame | None, sources: Sequence[str]) -> list[str]:
    """Published figures side by side with the records of the same problem (when any)."""
    if table is None:
        return []
    items = "".join(f"<li>{html.escape(s)}</li>" for s in sources)
    return [
        '<section id="anchors"><h2>Published figures side by side</h2>',
        '<p class="note">Published numbers (papers, vendor tables, charts read off their '
        "images) beside the records of the same GPU model, heads, dtype, length, mask, "
        "strategy, world size and kernel; lcab/published above 1: faster than published "
        "(also <code>anchors.csv</code>, <code>anchors.md</code>; "
        "<code>python -m lcab.report anchors --all</code> lists every figure and why it has "
        "no match).</p>",
        f'<div class="scroll">{html_table(table)}</div><ul class="note">{items}</ul></section>',
    ]
