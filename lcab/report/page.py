"""The report's one-file HTML page: plots by section, then the tables (`lcab.report.tables`).

plotly.js is inlined once in its head and every plot is a ``<div>`` drawn by a short script,
so the page opens offline, from a laptop or a cluster's shared disk, without a server or a CDN.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lcab.report.plot_data import OPTIONAL_SECTIONS, SECTIONS, Figures
from lcab.report.tables import (
    ABOVE_PEAK,
    IMPLAUSIBLE_NOTE,
    format_value,
    marked_summary,
    predictions_headline,
    shown_columns,
)

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
