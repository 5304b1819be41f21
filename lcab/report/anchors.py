"""Published figures beside lcab's own: the matching, the side-by-side table, the command.

``python -m lcab.report anchors RECORDS...`` puts each published number of
`lcab.records.published` beside every lcab row (`lcab.report.anchor_rows`) of the same problem,
with the ratio lcab / published. *Same problem* means every check of `CHECKS` passes; they run
broadest first, so the first that no lcab row passes is why a number has no match (``--all``).
The guide (lcab/report/README.md, *Published figures side by side*) says what the checks cover
and how to read document-mask ratios.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

import pandas as pd
from rich import box
from rich.table import Table

from lcab.records.published import Published, load_published
from lcab.records.table import console
from lcab.report.anchor_rows import MEASURED, LcabRow


def _tokens(n: int) -> str:
    """``8K``, ``1,536``: a length in K where it is a whole number of them."""
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


def _same(a: object, b: object) -> bool:
    """Parameter values equal, numbers compared as numbers (``0.5`` == ``0.50``)."""
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _values(row: LcabRow, unit: str) -> dict[str, float]:
    return row.tflops if unit == "TFLOP/s" else row.ms


@dataclass(frozen=True)
class Check:
    """One condition of a match, and what it says when no lcab row meets it."""

    name: str
    ok: Callable[[Published, LcabRow], bool]
    why: Callable[[Published], str]


def _equal(name: str, fields: str, why: Callable[[Published], str]) -> Check:
    """A check that the lcab row and the published number agree on ``fields``."""
    key = attrgetter(*fields.split())
    return Check(name, lambda p, r: key(r) == key(p), why)


CHECKS = (
    _equal("GPU", "gpu", lambda p: f"no lcab row on {p.gpu}"),
    Check("dtype", lambda p, r: r.dtype in p.dtypes, lambda p: f"no lcab {'/'.join(p.dtypes)} row"),
    _equal(
        "heads",
        "heads_q heads_kv head_dim",
        lambda p: f"no lcab row with {p.heads_q}:{p.heads_kv} heads of dim {p.head_dim}",
    ),
    _equal(
        "batch",
        "batch",
        lambda p: f"batch {p.batch} x {_tokens(p.seqlen)}: lcab runs one sequence a call",
    ),
    _equal(
        "CP",
        "cp world",
        lambda p: "no one-GPU lcab row" if p.cp == "none" else f"no lcab {p.cp} on {p.world} GPUs",
    ),
    Check(
        "GPUs a node",
        lambda p, r: p.gpus_per_node is None or r.gpus_per_node in (None, p.gpus_per_node),
        lambda p: f"no lcab row with {p.gpus_per_node} GPUs a node",
    ),
    _equal("mask", "mask", lambda p: f"no lcab {p.mask} row"),
    Check(
        "mask parameters",
        lambda p, r: all(_same(r.mask_params.get(k), v) for k, v in p.mask_params.items()),
        lambda p: "no lcab row with " + ", ".join(f"{k}={v}" for k, v in p.mask_params.items()),
    ),
    Check(
        "kernel",
        lambda p, r: r.kernel in p.kernels,
        lambda p: (
            f"no lcab row of {'/'.join(p.kernels)}"
            if p.kernels
            else f"lcab has no kernel for {p.library}"
        ),
    ),
    _equal("tokens", "seqlen", lambda p: f"no lcab row at {p.seqlen:,} tokens"),
    Check(
        "pass",
        lambda p, r: p.pass_ in _values(r, p.unit),
        lambda p: f"no lcab {p.pass_} figure (not run, or not ok)",
    ),
)
"""What a match needs, broadest first: the first one failed for every row is the reason."""


def match(published: Published, rows: Iterable[LcabRow]) -> tuple[list[LcabRow], str]:
    """(the lcab rows of ``published``'s problem, why there are none: ``""`` when there are)."""
    candidates = list(rows)
    if not candidates:
        return [], "no lcab rows"
    for check in CHECKS:
        candidates = [r for r in candidates if check.ok(published, r)]
        if not candidates:
            return [], check.why(published)
    return candidates, ""


@dataclass(frozen=True)
class SideBySide:
    """A published number and one lcab row of its problem (None, with ``why``: none)."""

    published: Published
    lcab: LcabRow | None = None
    why: str = ""

    @property
    def value(self) -> float | None:
        """The lcab row's figure for the published pass, in the published unit."""
        if self.lcab is None:
            return None
        return _values(self.lcab, self.published.unit)[self.published.pass_]

    @property
    def ratio(self) -> float | None:
        """The lcab figure over the published one."""
        return None if self.value is None else self.value / self.published.value


def side_by_side(
    rows: Sequence[LcabRow],
    published: Sequence[Published] | None = None,
    unmatched: bool = False,
) -> list[SideBySide]:
    """Every published number with each lcab row of its problem, in the data file's order.

    With ``unmatched``, also the numbers no lcab row matches, each with why.
    """
    by_gpu: dict[str | None, list[LcabRow]] = {}
    for row in rows:
        by_gpu.setdefault(row.gpu, []).append(row)
    out = []
    for pub in load_published() if published is None else published:
        bucket = by_gpu.get(pub.gpu, [])
        if bucket:
            found, why = match(pub, bucket)
        elif not unmatched:
            continue
        else:  # no row on its GPU (or none at all): said without looking at every row
            found, why = [], CHECKS[0].why(pub) if rows else "no lcab rows"
        found.sort(key=lambda r: (r.label != MEASURED, r.source, r.kernel))
        out += [SideBySide(pub, r) for r in found]
        if not found and unmatched:
            out.append(SideBySide(pub, why=why))
    return out


def _figure(p: Published) -> str:
    what = p.library if p.cp == "none" else f"{p.cp} ({p.library})"
    params = "".join(f" {k}={v}" for k, v in p.mask_params.items())
    return f"{what} {p.mask}{params} {p.pass_}"


def _shape(p: Published) -> str:
    batch = f"{p.batch}x" if p.batch > 1 else ""
    return batch + _tokens(p.seqlen) + (f" on {p.world}" if p.world > 1 else "")


def anchors_frame(pairs: Sequence[SideBySide]) -> pd.DataFrame:
    """The side-by-side table: one row per pair (report page, Markdown, CSV)."""
    records = []
    for s in pairs:
        p = s.published
        records.append(
            {
                "published figure": _figure(p),
                "GPU": p.gpu,
                "heads": f"{p.heads_q}:{p.heads_kv}x{p.head_dim}",
                "tokens": _shape(p),
                "published": p.value,
                "±": p.error if p.read == "chart" else None,
                "unit": p.unit,
                "source": p.source_id,
                "lcab": None if s.value is None else round(s.value, 1),
                "lcab row": "" if s.lcab is None else f"{s.lcab.label}: {s.lcab.kernel}",
                "lcab/published": None if s.ratio is None else round(s.ratio, 2),
                "why no match": s.why,
                "lcab file": "" if s.lcab is None else s.lcab.source,
                "lcab note": "" if s.lcab is None else s.lcab.note,
                "published at": p.url,
            }
        )
    return pd.DataFrame(records)


SHOWN = ("published figure", "GPU", "heads", "tokens", "published", "±", "source", "lcab")
SHOWN_TAIL = ("lcab row", "lcab/published")
"""Columns of the Markdown and HTML tables (``why no match`` too where a row has one)."""


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The columns a reader needs of `anchors_frame` (the CSV keeps every column)."""
    columns = [*SHOWN, *SHOWN_TAIL] + (["why no match"] if frame["why no match"].any() else [])
    return frame[columns]


def source_notes(pairs: Sequence[SideBySide]) -> list[str]:
    """One line per source the pairs cite: citation, figures, how read, where."""
    figures: dict[str, list[Published]] = {}
    for s in pairs:
        group = figures.setdefault(s.published.source_id, [])
        if all(g.figure != s.published.figure for g in group):
            group.append(s.published)
    lines = []
    for source_id, group in figures.items():
        first = group[0]
        where = f"{first.repo}@{first.commit[:8]}" if first.repo else first.url
        reads = ", ".join(dict.fromkeys(p.how_read for p in group))
        docs = next((p.docs for p in group if p.docs), "")
        lines.append(
            f"{source_id}: {first.source}; {', '.join(p.figure for p in group)}; {reads}; "
            f"{where}" + (f"; document masks: {docs}" if docs else "")
        )
    return lines


def lcab_notes(pairs: Sequence[SideBySide]) -> list[str]:
    """One line per note lcab's rows carry (the planner's harness, assumed heads), with files."""
    files: dict[str, set[str]] = {}
    for s in pairs:
        if s.lcab is not None and s.lcab.note:
            files.setdefault(s.lcab.note, set()).add(s.lcab.source)
    return [
        f"lcab rows of {len(f)} file{'s' if len(f) > 1 else ''} ({min(f)}"
        + (", ..." if len(f) > 1 else "")
        + f"): {note}"
        for note, f in files.items()
    ]


def rich_table(pairs: Sequence[SideBySide], title: str) -> tuple[Table, list[str]]:
    """The terminal table and the reasons its unmatched rows point to (``[n]``).

    What every row shares (GPU, heads) is said once in the title, the rest of the setting in
    one column; numbers never wrap, texts fold; a reason is a note below, as in
    `lcab.records.table`, so a long one never widens the table.
    """
    frame = anchors_frame(pairs)
    shared = {c: frame[c].iloc[0] for c in ("GPU", "heads") if frame[c].nunique() == 1}
    said = ", ".join(f"{c} {v}" for c, v in shared.items())
    table = Table(
        title=f"{title}: {said}" if said else title, title_justify="left", box=box.SIMPLE_HEAD
    )
    for column in TERMINAL:
        numeric = column in ("published", "lcab", "ratio")
        table.add_column(
            column,
            justify="right" if numeric else "left",
            no_wrap=numeric or column == "source",
            overflow="fold",
        )
    reasons: list[str] = []
    for s, row in zip(pairs, frame.to_dict("records"), strict=True):
        setting = " ".join(str(row[c]) for c in ("GPU", "heads", "tokens") if c not in shared)
        published = f"{s.published.value:.4g}"
        if s.published.read == "chart":
            published += f" ±{s.published.error:g}"
        if s.lcab is None:
            reasons += [] if s.why in reasons else [s.why]
            cells = ["", "", f"[{reasons.index(s.why) + 1}]"]
        else:
            ratio = s.ratio or 0.0
            cells = [f"{s.value:.3g}", f"{ratio:.2f}", row["lcab row"]]
        table.add_row(row["published figure"], setting, published, row["source"], *cells)
    return table, reasons


TERMINAL = ("published figure", "setting", "published", "source", "lcab", "ratio", "lcab row")
"""Columns of the terminal table (``ratio`` = lcab / published)."""


def command(args: argparse.Namespace) -> int:
    """``python -m lcab.report anchors``: print the table; 2 on bad input (one line)."""
    from lcab.records.published import BadPublishedError
    from lcab.report.anchor_rows import PREDICTED, read_lcab_rows
    from lcab.report.frame import BadInputError
    from lcab.report.tables import markdown_table

    try:
        rows = read_lcab_rows(args.paths)
        published = load_published()
    except (BadInputError, BadPublishedError, OSError) as err:
        print(f"python -m lcab.report anchors: {err}", file=sys.stderr)
        return 2
    pairs = side_by_side(rows, published, unmatched=args.all)
    predicted = sum(r.label == PREDICTED for r in rows)
    matched = {id(s.published) for s in pairs if s.lcab is not None}
    head = (
        f"{len(rows)} lcab rows ({len(rows) - predicted} measured, {predicted} predicted); "
        f"{len(matched)} of {len(published)} published figures have a match"
    )
    if not pairs:
        print(f"{head}. --all lists every published figure and why it has none.")
        return 0
    notes = source_notes(pairs) + lcab_notes(pairs)
    if args.markdown:
        print(head + "\n\n" + markdown_table(shown(anchors_frame(pairs))))
        print("Sources and notes:\n\n" + "\n".join(f"- {n}" for n in notes))
        return 0
    out = console()
    table, reasons = rich_table(pairs, "Published figures beside lcab")
    out.print(table)
    for number, why in enumerate(reasons, 1):
        out.print(f"[{number}] {why}", highlight=False)
    out.print(head + ". ratio = lcab / published.")
    for note in notes:
        out.print(note, overflow="fold", highlight=False)
    return 0
