"""The report's tables, from `load_records`' frame: summary, reasons, measured vs predicted.

The summary has one row per cell and length (status, times, TFLOP/s, memory, numerical error,
why it did not run; with telemetry, the share of the device's peak and the energy per token,
and a ``!`` on a TFLOP/s above that peak); the reasons group why lengths were skipped or
failed, with counts and where. `lcab.report.build` writes them as CSV and Markdown and
`lcab.report.page` shows them.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lcab.flops import PASSES
from lcab.plot.data import severity
from lcab.records.table import throughput_unit
from lcab.report.clocks import implausible

SUMMARY_COLUMNS = (
    *("mask", "series", "kernel", "cp", "world_size", "variant", "seqlen", "status"),
    *("fwd_ms_p50", "fwd_tflops", "bwd_ms_p50", "bwd_tflops"),
    *("fwd_predicted_ratio", "bwd_predicted_ratio", "fwd_mem_peak_mib", "bwd_mem_peak_mib"),
    *("fwd_max_abs_err", "bwd_max_abs_err", "run_id"),
)
"""Record columns of the summary table, in order; a ``reason`` column follows."""
SUMMARY_PASSES = ("fwd", "bwd")
"""Passes whose TFLOP/s the summary shows."""
TELEMETRY_COLUMNS = (
    ("peak_pct", "peak_share", 100.0),
    ("energy_j_per_token", "energy_j_per_token", 1.0),
)
"""(summary column, record field, factor) after ``<pass>_``: the peak share (%) and energy per
token (J), shown for a pass only where some record has a value."""
ABOVE_PEAK = "above_peak"
"""Summary column naming the passes that ran above their device's peak (only when one did)."""
IMPLAUSIBLE_MARK = "!"
IMPLAUSIBLE_NOTE = (
    f"{IMPLAUSIBLE_MARK} after a throughput: above the device's peak at its clock: FLOP count or "
    "timer error (the reasons give the numbers)"
)
REASON_COLUMNS = ("status", "reason", "passes", "records", "where")
PREDICTION_COLUMNS = (
    *("mask", "series", "world_size", "variant", "seqlen", "pass", "measured_ms", "predicted_ms"),
    *("measured_tflops", "predicted_tflops", "ratio", "hardware", "flag"),
)
"""Measured vs predicted, one row per pass of an ``ok`` record that has a prediction."""
WITHIN = 0.30
"""The planner guide's validation tolerance (±30 %), counted in the table's headline."""
MAX_WHERE = 6
"""Cells named in a reason's ``where`` before "+N more"."""


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per record: cell, length, status, p50 times, TFLOP/s, memory, errors, reason.

    Telemetry adds `TELEMETRY_COLUMNS` after the TFLOP/s and ``above_peak`` (passes above their
    device's peak) where records have them.
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
    """``table`` with ``*_tflops`` as ``*_gflops`` when every record ran on a CPU."""
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
    """The summary to read (Markdown, page): TFLOP/s above the peak end in ``!`` (not in CSV)."""
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
    """Why things did not run, by (status, reason), worst first: passes, record count, where."""
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
    """Measured vs predicted per pass, furthest from 1 first (``ratio`` = measured / predicted).

    ``flag`` repeats the record's warning mark (outside ``lcab.plan.record_prediction``'s band).
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
