"""Two campaigns compared cell by cell, and what differs between them that could explain it.

``python -m lcab.report compare OLD NEW``; the guide (lcab/report/README.md, *Two campaigns
compared*) says what it does and why. A cell matches its twin on `CELL_KEY` only, so campaigns
may change protocol, threads, seeds, driver or GPU (the provenance table says what changed); a
cell run twice in one campaign counts once, its latest record. Per matched cell and pass: the
time ratio NEW/OLD with its 95 % interval and a verdict (`lcab.report.compare_stats`), or
``stopped``/``started`` when a pass ran in one campaign only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lcab.flops import PASSES
from lcab.plot.data import (
    LineFigure,
    Panel,
    RefLine,
    log2_axis,
    name_stem,
    seqlen_label,
)
from lcab.records.table import console, duration
from lcab.report.compare_stats import BASIS_QUANTILES, BASIS_REPS, PassTimes, compare_times
from lcab.report.frame import SERIES, VARIANT, BadInputError, load_records, named_input
from lcab.report.plot_style import PASS_TITLES, SEQLEN_AXIS, Styler, hardware_label
from lcab.report.provenance import provenance_table

SECTION = "compare"
CELL_KEY = (
    *("kernel", "kernel_options", "cp", "cp_params", "mask", "mask_params", "seqlen"),
    *("world_size", "nodes", "dtype", "heads_q", "heads_kv", "head_dim"),
)
"""What defines a cell across campaigns (``kernel_options``: the config's ``kernel`` group)."""
NAMED = ("kernel", "cp", "mask", "seqlen", "world_size")
"""Key fields every cell label shows; the others only where the compared cells differ in them."""
STOPPED, STARTED = "stopped", "started"
EXIT_GATE = 1
"""Exit status of ``--fail-slower`` when a cell is slower beyond its interval and the threshold."""


@dataclass(frozen=True)
class Comparison:
    """Everything `compare` found, as tables."""

    labels: tuple[str, str]
    cells: pd.DataFrame
    """One row per matched cell and pass that ran in either campaign (`compare` says which)."""
    unmatched: pd.DataFrame
    """Cells of one campaign only: ``only in``, ``cells`` (but the length), ``seqlen`` (the
    lengths), ``status``."""
    provenance: pd.DataFrame
    """``what``, the two labels' values, ``differs``."""

    def counts(self) -> str:
        """``24 matched cells, 48 passes: 3 slower, ...; unmatched: 2 only in old``."""
        verdicts = self.cells["verdict"].str.split(":").str[0].value_counts()
        said = ", ".join(f"{n} {v}" for v, n in verdicts.items())
        only = self.unmatched.groupby("only in")["seqlen"].agg(
            lambda s: s.str.count(",").sum() + len(s)
        )
        lone = ", ".join(f"{n} only in {label}" for label, n in only.items()) or "none"
        matched = self.cells["cell"].nunique()
        return f"{matched} matched cells, {len(self.cells)} passes: {said}; unmatched: {lone}"

    def gate(self, percent: float) -> pd.DataFrame:
        """Passes slower than ``percent`` beyond their interval, and passes that stopped."""
        slower = (self.cells["verdict"] == "slower") & (self.cells["low"] > 1 + percent / 100)
        return self.cells[slower | self.cells["verdict"].str.startswith(STOPPED)]


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` indexed by cell identity (JSON of `CELL_KEY`), the latest record of each."""
    out = frame.copy()
    out["kernel_options"] = [
        {k: v for k, v in (c or {}).get("kernel", {}).items() if k != "name"} for c in out["config"]
    ]
    out["key"] = [
        json.dumps([row[k] for k in CELL_KEY], sort_keys=True, default=str)
        for row in out[list(CELL_KEY)].to_dict("records")
    ]
    out = out.sort_values("created_at", kind="stable").drop_duplicates("key", keep="last")
    return out.set_index("key")


def _labels(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Per cell of either campaign: ``cell`` (its label), ``group`` and ``variant``.

    ``variant``: the key fields beyond `NAMED` in which cells sharing those fields differ.
    """
    both = pd.concat([old, new])
    both = both[~both.index.duplicated()]
    text = both[list(CELL_KEY)].map(lambda v: json.dumps(v, sort_keys=True, default=str))
    named = [text[k] for k in NAMED]
    varying = [k for k in CELL_KEY if k not in NAMED and text[k].groupby(named).nunique().max() > 1]
    out = pd.DataFrame(index=both.index)
    out[VARIANT] = [", ".join(f"{k}={r[k]}" for k in varying) for _, r in text.iterrows()]
    world = both["world_size"].map(lambda w: f" ×{w}" if w > 1 else "")
    out["group"] = both[SERIES] + " " + both["mask"] + world + " " + out[VARIANT]
    out["group"] = out["group"].str.strip()
    out["cell"] = [
        f"{r[SERIES]} {r['mask']} {seqlen_label(r['seqlen'])}{w} {v}".strip()
        for (_, r), w, v in zip(both.iterrows(), world, out[VARIANT], strict=True)
    ]
    return out


def _times(row: pd.Series, pass_: str) -> PassTimes | None:
    """A pass's times from a record row (None: it did not run ``ok`` or has no time)."""
    p50 = row.get(f"{pass_}_ms_p50")
    if row.get(f"{pass_}_status") != "ok" or not isinstance(p50, float) or math.isnan(p50):
        return None
    reps = row.get(f"{pass_}_ms_reps")
    return PassTimes(p50, row.get(f"{pass_}_ms_p20"), row.get(f"{pass_}_ms_p80"), reps)


def compare(old: pd.DataFrame, new: pd.DataFrame, labels: tuple[str, str]) -> Comparison:
    """Match the cells of two campaigns (`load_records` frames) and compare every pass."""
    before, after = _keyed(old), _keyed(new)
    label = _labels(before, after)
    rows: list[dict[str, Any]] = []
    for key in before.index.intersection(after.index):
        a, b = before.loc[key], after.loc[key]
        for pass_ in (p for p in PASSES if p in (a["passes"] or []) and p in (b["passes"] or [])):
            ta, tb = _times(a, pass_), _times(b, pass_)
            row = {
                **{k: b[k] for k in ("mask", SERIES, "world_size", "seqlen")},
                VARIANT: label.loc[key, VARIANT],
                "cell": label.loc[key, "cell"],
                "pass": pass_,
                "old_ms": ta.p50 if ta else None,
                "new_ms": tb.p50 if tb else None,
            }
            if ta and tb:
                found = compare_times(ta, tb)
                row |= {"ratio": found.ratio, "low": found.low, "high": found.high}
                row |= {"basis": found.basis, "verdict": found.verdict}
                row |= {"old_reps": len(ta.reps or ()), "new_reps": len(tb.reps or ())}
            elif ta:
                row["verdict"] = f"{STOPPED}: {b[f'{pass_}_status']}"
            elif tb:
                row["verdict"] = f"{STARTED}: was {a[f'{pass_}_status']}"
            else:
                continue  # ran in neither: nothing to compare
            rows.append(row)
    cells = pd.DataFrame(rows, columns=[*TABLE_COLUMNS])
    effect = cells["ratio"].map(lambda r: -abs(math.log(r)) if r == r and r else -math.inf)
    cells = cells.assign(_effect=effect).sort_values("_effect", kind="stable")
    lone = pd.DataFrame(
        [
            {"only in": name, "cells": label.loc[key, "group"], "seqlen": frame.loc[key, "seqlen"]}
            | {"status": frame.loc[key, "status"]}
            for frame, other, name in ((before, after, labels[0]), (after, before, labels[1]))
            for key in frame.index.difference(other.index)
        ],
        columns=["only in", "cells", "seqlen", "status"],
    )
    unmatched = (
        lone.sort_values("seqlen")
        .groupby(["only in", "cells", "status"], sort=True)["seqlen"]
        .agg(lambda s: ", ".join(map(seqlen_label, s)))
        .reset_index()[["only in", "cells", "seqlen", "status"]]
    )
    return Comparison(
        labels,
        cells.drop(columns="_effect").reset_index(drop=True),
        unmatched,
        provenance_table(old, new, labels),
    )


TABLE_COLUMNS = (
    *("mask", SERIES, "world_size", "seqlen", VARIANT, "cell", "pass", "old_ms", "new_ms"),
    *("ratio", "low", "high", "basis", "verdict", "old_reps", "new_reps"),
)
"""``compare.csv``'s columns: ratio = NEW/OLD time (Hodges–Lehmann with reps), low/high its
95 % interval (basis ``reps``) or its quantile band (basis ``p20–p80``)."""


def _interval(row: pd.Series) -> str:
    if row["basis"] == BASIS_REPS:
        return f"{row['low']:.3f}–{row['high']:.3f}"
    if row["basis"] == BASIS_QUANTILES:
        return f"({row['low']:.3f}–{row['high']:.3f})"
    return "–"


def shown_table(comparison: Comparison) -> pd.DataFrame:
    """The table to read: cell, pass, both times, the ratio, its interval, the verdict."""
    old, new = comparison.labels
    cells = comparison.cells
    return pd.DataFrame(
        {
            "cell": cells["cell"],
            "pass": cells["pass"],
            old: cells["old_ms"].map(_ms),
            new: cells["new_ms"].map(_ms),
            f"{new}/{old}": cells["ratio"].map(lambda r: f"{r:.3f}" if r == r else "–"),
            "95 % interval": [_interval(r) for _, r in cells.iterrows()],
            "verdict": cells["verdict"],
        }
    )


def compared_tables(comparison: Comparison) -> list[pd.DataFrame]:
    """What the report page shows under the comparison's figures: cells, provenance, lone cells."""
    lone = [comparison.unmatched] if len(comparison.unmatched) else []
    return [shown_table(comparison), comparison.provenance, *lone]


def _ms(value: Any) -> str:
    return duration(value) if isinstance(value, float) and value == value else "–"


INTERVAL_NOTE = (
    "95 % interval: Mann–Whitney interval of the Hodges–Lehmann ratio from the kept "
    "repetitions; (in parentheses): the p20–p80 band, for records without enough repetitions"
)


def compare_figures(comparison: Comparison, frame: pd.DataFrame) -> list[LineFigure]:
    """Per mask: NEW/OLD time against length, a line per series, its interval as the band."""
    old, new = comparison.labels
    rows = comparison.cells[comparison.cells["ratio"].notna()]
    styler = Styler(rows)
    figures = []
    for mask, of_mask in rows.groupby("mask", sort=True):
        panels = []
        for pass_ in (p for p in PASSES if p in set(of_mask["pass"])):
            lines = []
            for (series, world, variant), g in of_mask[of_mask["pass"] == pass_].groupby(
                [SERIES, "world_size", VARIANT], sort=True
            ):
                style = styler.line(str(series), int(world), str(variant), "/" in str(series))
                g = g.sort_values("seqlen")
                lines.append(
                    style.draw(
                        (float(x) for x in g["seqlen"]),
                        g["ratio"],
                        low=tuple(g["low"].fillna(math.nan)),
                        high=tuple(g["high"].fillna(math.nan)),
                        hover=tuple(
                            f"{r['cell']}\n{new}/{old} {r['ratio']:.3f} {_interval(r)}\n"
                            f"{r['verdict']}"
                            for _, r in g.iterrows()
                        ),
                    )
                )
            label = f"time {new} / {old} (above 1: slower)"
            refs = (RefLine(1.0, "no change"),)
            panels.append(Panel(PASS_TITLES[pass_], label, True, tuple(lines), refs=refs))
        bases = set(of_mask["basis"])
        band = "95 % interval" if bases == {BASIS_REPS} else "95 % interval or p20–p80 band"
        title = f"{new} vs {old}: {mask} (line: time ratio, band: its {band})"
        hardware = hardware_label(frame[frame["mask"] == mask])
        axis = log2_axis(SEQLEN_AXIS, of_mask["seqlen"])
        figures.append(
            LineFigure(
                f"{SECTION}_{name_stem(new)}_{name_stem(str(mask))}",
                SECTION,
                " · ".join(t for t in (title, hardware) if t),
                axis,
                tuple(panels),
            )
        )
    return figures


def markdown(comparison: Comparison) -> str:
    """``compare.md``: the counts, the table, what differs, the unmatched cells."""
    from lcab.report.tables import markdown_table

    parts = [comparison.counts() + ".", markdown_table(shown_table(comparison)), INTERVAL_NOTE]
    parts += ["", "Provenance:", "", markdown_table(comparison.provenance)]
    if len(comparison.unmatched):
        parts += ["Cells in one campaign only:", "", markdown_table(comparison.unmatched)]
    return "\n".join(parts)


def write(comparison: Comparison, folder: Path) -> None:
    """``compare.csv`` (every number) and ``compare.md`` (`markdown`) in ``folder``."""
    (folder / "png").mkdir(parents=True, exist_ok=True)
    comparison.cells.to_csv(folder / "compare.csv", index=False)
    (folder / "compare.md").write_text(markdown(comparison), encoding="utf-8")


def _print(comparison: Comparison) -> None:
    """The table, the counts, what differs and the unmatched cells, within the terminal."""
    from rich.table import Table

    old, new = comparison.labels
    out = console()
    for frame, title in (
        (shown_table(comparison), f"{new} vs {old}: time ratio (above 1: {new} slower)"),
        (comparison.provenance, "What differs (≠) between the campaigns"),
    ):
        table = Table(title=title, title_justify="left")
        for column in frame.columns:
            cells = frame is not comparison.provenance
            table.add_column(column, overflow="fold", no_wrap=cells and column != "cell")
        for row in frame.itertuples(index=False):
            table.add_row(*map(str, row))
        out.print(table)
        if cells:
            out.print(comparison.counts() + ". " + INTERVAL_NOTE + ".", highlight=False)
    for row in comparison.unmatched.itertuples(index=False):
        out.print(f"only in {row[0]}: {row[1]} at {row[2]} ({row[3]})", highlight=False)


def command(args: argparse.Namespace) -> int:
    """``python -m lcab.report compare``: print, write, and gate (see the module docstring)."""
    from lcab.report.compare_wandb import fetched, wandb_report

    given = [args.old, args.new]
    labels = tuple(named_input(p)[0] or d for p, d in zip(given, ("old", "new"), strict=True))
    try:
        old, new = (load_records(fetched(p)) for p in given)
    except (BadInputError, ValueError) as err:
        print(f"python -m lcab.report compare: {err}", file=sys.stderr)
        return 2
    comparison = compare(old, new, (labels[0], labels[1]))
    _print(comparison)
    where = named_input(args.new)[1]
    folder = args.out or (where.parent if where.is_file() else where) / "compare"
    write(comparison, folder)
    from lcab.plot.png import render_png

    figures = compare_figures(comparison, pd.concat([old, new]))
    for figure in figures:
        render_png(figure, folder / "png" / f"{figure.name}.png")
    print(f"written: {folder}/compare.csv, compare.md and {len(figures)} figure(s) in png/")
    if args.wandb_report or args.wandb_dry_run:
        status = wandb_report(args, comparison.labels, markdown(comparison))
        if status:
            return status
    if args.fail_slower is None:
        return 0
    failing = comparison.gate(args.fail_slower)
    for _, row in failing.iterrows():
        why = row["verdict"]
        if why == "slower":
            why = f"slower by {row['ratio'] - 1:+.1%}, 95 % interval {_interval(row)}"
        print(f"lcab compare: {row['cell']} {row['pass']}: {why}", file=sys.stderr)
    if len(failing):
        stopped = int(failing["verdict"].str.startswith(STOPPED).sum())
        print(
            f"lcab compare: {len(failing) - stopped} pass(es) slower than +{args.fail_slower:g} % "
            f"beyond their interval, {stopped} stopped running",
            file=sys.stderr,
        )
    return EXIT_GATE if len(failing) else 0
