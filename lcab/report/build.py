"""`build_report`: records in, a report folder out (HTML page, PNGs, CSV and Markdown tables).

The folder holds ``index.html`` (offline, plotly.js inlined), ``png/<figure>.png``, and
``summary``, ``predicted``, ``reasons``, ``anchors``, ``frontier`` and ``compare`` as ``.csv``
and ``.md`` (the last three only when they have rows). Every input is read before anything is
written, so bad input leaves no half-built report; PNGs of figures no longer drawn are removed,
so the folder always matches the page.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lcab.records.sinks import RECORDS_FILE
from lcab.report.anchor_rows import rows_from_frame
from lcab.report.anchors import anchors_frame, side_by_side, source_notes
from lcab.report.anchors import shown as shown_anchors
from lcab.report.compare import compare, compare_figures, compared_tables, write
from lcab.report.figures import build_figures
from lcab.report.frame import RUN, SOURCE, load_records, named_input
from lcab.report.frontier import frontier_table
from lcab.report.page import PageInputs, render_page
from lcab.report.tables import (
    markdown_table,
    predictions_headline,
    predictions_table,
    reasons_table,
    shown_columns,
    summary_markdown,
    summary_table,
)

REPORT_DIR = "report"
"""Default output folder, inside the first input folder."""
PNG_DIR = "png"


@dataclass(frozen=True)
class BuiltReport:
    """Where a report went and what it holds."""

    folder: Path
    index: Path
    png_dir: Path
    figures: list[str] = field(default_factory=list)
    """Names of the figures drawn (each is on the page and is ``png/<name>.png``)."""
    omitted: list[str] = field(default_factory=list)
    """Why figures were not drawn, one line each."""
    num_records: int = 0


def default_out(first: Path) -> Path:
    """``<first folder>/report``; for a records file, the folder holding it."""
    folder = first.parent if first.is_file() else first
    return folder / REPORT_DIR


def build_report(paths: Sequence[Path | str], out: Path | str | None = None) -> BuiltReport:
    """Write the report of the records under ``paths`` to ``out`` (default: `default_out`).

    `lcab.report.frame.BadInputError`: a path does not exist or holds no records.
    """
    inputs = [named_input(p)[1] for p in paths]
    frame = load_records(list(paths))
    figures = build_figures(frame)
    runs, compared = frame.attrs[RUN], None
    if len(runs) >= 2:  # the second named run against the first
        old, new = (frame[frame[RUN] == run] for run in runs[:2])
        compared = compare(old, new, (runs[0], runs[1]))
        figures.figures += compare_figures(compared, frame)
    folder = Path(out) if out is not None else default_out(inputs[0])
    png_dir = folder / PNG_DIR
    png_dir.mkdir(parents=True, exist_ok=True)

    from lcab.plot.html import figure_div, plotly_js
    from lcab.plot.png import render_png

    drawn = {f.name for f in figures.figures}
    for stale in png_dir.glob("*.png"):
        if stale.stem not in drawn:
            stale.unlink()
    for figure in figures.figures:
        render_png(figure, png_dir / f"{figure.name}.png")

    summary, reasons = summary_table(frame), reasons_table(frame)
    _write(folder, "summary", summary, summary_markdown(summary))
    predicted = predictions_table(frame)
    markdown = markdown_table(shown_columns(predicted))
    _write(folder, "predicted", predicted, predictions_headline(predicted) + "\n\n" + markdown)
    pairs = side_by_side(rows_from_frame(frame))
    anchors = anchors_frame(pairs) if pairs else None
    notes = "".join(f"\n- {n}" for n in source_notes(pairs))
    if anchors is not None:
        markdown = markdown_table(shown_anchors(anchors)) + "\nSources:\n" + notes + "\n"
    _write(folder, "anchors", anchors, markdown)
    _write(folder, "compare", None, "")  # written whole by `write` below
    if compared is not None:
        write(compared, folder)
    frontier = frontier_table(frame)
    _write(folder, "frontier", frontier, "" if frontier is None else markdown_table(frontier))
    _write(
        folder,
        "reasons",
        reasons,
        markdown_table(reasons, max_text=400)
        if len(reasons)
        else "Every pass of every record ran `ok`: no reason to give.\n",
    )
    sections = {} if compared is None else {"compare": compared_tables(compared)}

    page = render_page(
        figures,
        PageInputs(
            sources=[(str(p), _count_from(frame, p)) for p in inputs],
            num_records=len(frame),
            summary=summary,
            reasons=reasons,
            divs={f.name: figure_div(f) for f in figures.figures},
            predictions=predicted,
            anchors=None if anchors is None else shown_anchors(anchors),
            anchor_sources=source_notes(pairs),
            section_tables=sections | ({} if frontier is None else {"frontier": [frontier]}),
        ),
        plotly_js(),
    )
    index = folder / "index.html"
    index.write_text(page, encoding="utf-8")
    return BuiltReport(
        folder=folder,
        index=index,
        png_dir=png_dir,
        figures=[f.name for f in figures.figures],
        omitted=[f"{o.section}: {o.why}" for o in figures.omitted],
        num_records=len(frame),
    )


def _write(folder: Path, name: str, table: pd.DataFrame | None, markdown: str) -> None:
    """``<name>.csv`` and ``<name>.md``; None removes an earlier build's (nothing to show now)."""
    for stale in (folder / f"{name}.csv", folder / f"{name}.md"):
        stale.unlink(missing_ok=True)
    if table is not None:
        table.to_csv(folder / f"{name}.csv", index=False)
        (folder / f"{name}.md").write_text(markdown, encoding="utf-8")


def _count_from(frame: pd.DataFrame, path: Path) -> int:
    """Records of ``frame`` read from ``path`` (a file, or any records file below a folder)."""
    root = path.resolve()
    if root.is_file() or root.name == RECORDS_FILE:
        return int((frame[SOURCE].map(lambda s: Path(s).resolve() == root)).sum())
    return int(frame[SOURCE].map(lambda s: root in Path(s).resolve().parents).sum())


def command(args: argparse.Namespace) -> int:
    """``python -m lcab.report build``: write the report and say where (2: bad input)."""
    from lcab.report.frame import BadInputError

    try:
        report = build_report(args.paths, out=args.out)
    except BadInputError as err:
        print(f"python -m lcab.report build: {err}", file=sys.stderr)
        return 2
    print(f"{report.num_records} records, {len(report.figures)} figures")
    for why in report.omitted:
        print(f"  not drawn: {why}")
    print(f"page: {report.index}")
    print(f"PNGs: {report.png_dir}")
    return 0
