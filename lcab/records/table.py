"""The results table: one row per record, in the units of the machine, within the terminal.

Used after each cell (`lcab.bench.console`) and once for a whole sweep (`lcab.records.summary`).
Columns: kernel, cp, mask, seqlen, status; per pass its median time and throughput; "vs plan"
(measured / predicted throughput, forward/backward); where a device reports power or has a
known peak, the first pass's clock, power and share of the peak (red with ``!`` above the
peak); a note number. Three choices keep it
readable where it is read:

* **units of the machine**: records that all ran on a CPU show GFLOP/s (a CPU's 5 GFLOP/s read
  "0.00525 TFLOP/s"), any GPU record makes the table TFLOP/s; times read "4.01 ms" or "1.23 s",
  never "1.23e+03";
* **notes below the table**: a skip reason or an off-the-plan warning is as long as a row; in
  a cell it wrapped each row over 7-8 lines, so the row carries ``[n]`` and the text follows
  the table, one line per distinct note;
* **the terminal's width**, or 120 columns where there is no terminal (logs, CI, SLURM output
  files), where rich would otherwise wrap at 80: what every row shares (kernel, cp, mask) is
  said once in the title, numbers never wrap, and a long name folds rather than being cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from lcab.cell import tokens_per_rank
from lcab.records.schema import RunRecord

WIDTH_OFF_TERMINAL = 120
"""Columns a table may take where no terminal says how many there are."""
PASS_ORDER = ("fwd", "bwd", "fwd_bwd")
SHAREABLE = ("kernel", "cp", "mask")
"""Columns said once in the title when every row of a table has the same value."""
STATUS_STYLE = {
    "ok": "green",
    "skipped": "yellow",
    "numerics_mismatch": "magenta",
    "oom": "red",
    "timeout": "red",
    "error": "bold red",
}


def console() -> Console:
    """A console as wide as the terminal, or `WIDTH_OFF_TERMINAL` columns off one."""
    found = Console()
    return found if found.is_terminal else Console(width=WIDTH_OFF_TERMINAL)


def throughput_unit(records: Sequence[RunRecord]) -> tuple[str, float]:
    """(unit, factor from TFLOP/s): GFLOP/s when every record ran on a CPU."""
    on_cpu = bool(records) and all(r.device == "cpu" for r in records)
    return ("GFLOP/s", 1e3) if on_cpu else ("TFLOP/s", 1.0)


def duration(ms: float | None) -> str:
    """A time as people read it: ``4.01 ms``, ``1.23 s`` (3 significant figures, no exponent)."""
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms" if ms >= 0.01 else f"{ms * 1000:.3g} us"


def rate(value: float | None) -> str:
    """A throughput to 3 significant figures, without an exponent up to 1e6."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def seqlen_text(r: RunRecord) -> str:
    """``8,192 (1,024/rank)``: the length, and what each rank holds of it under CP."""
    if r.cp == "none" or r.world_size <= 1:
        return f"{r.seqlen:,}"
    return f"{r.seqlen:,} ({tokens_per_rank(r.seqlen, r.world_size):,}/rank)"


def note_of(r: RunRecord) -> str:
    """What the row's note says: its reason, else its planner warning; a shared GPU first."""
    note = r.reasons[0] if r.reasons else (r.prediction_warning or "")
    if r.shared_device:  # ranks shared a GPU: the times are shown, but measure nothing
        note = "shared GPU: times not a measurement" + (f"; {note}" if note else "")
    return note


def vs_plan(r: RunRecord, passes: Sequence[str]) -> str:
    """``0.97x/1.1x``: each requested pass's measured / predicted throughput, red when flagged."""
    ratios = [r.pass_result(p).predicted_ratio for p in passes if p in r.passes]
    text = "/".join(f"{x:.2g}x" for x in ratios if x is not None)
    return f"[red]{text}[/]" if text and r.prediction_warning else text or "-"


def device_text(r: RunRecord, passes: Sequence[str]) -> str:
    """``1,830 MHz 688 W 62%``: clock, power and share of the peak of the first timed pass.

    Red with ``!`` when a pass ran above its device's peak (`lcab.bench.pass_telemetry`).
    """
    for p in passes:
        res = r.pass_result(p)
        if p not in r.passes or res.status not in ("ok", "numerics_mismatch"):
            continue
        parts = []
        if res.clock_mhz_median is not None:
            parts.append(f"{res.clock_mhz_median:,.0f} MHz")
        if res.power_w is not None:
            parts.append(f"{res.power_w:,.0f} W")
        if res.peak_share is not None:
            parts.append(f"{res.peak_share * 100:.3g}%")
        text = " ".join(parts)
        implausible = any(r.pass_result(q).peak_implausible for q in r.passes)
        return f"[red]{text}![/]" if implausible else text or "-"
    return "-"


def records_table(
    records: Sequence[RunRecord], title: str = "lcab results"
) -> tuple[Table, list[str]]:
    """The table of ``records`` and the notes its rows point to (``[n]`` → ``notes[n-1]``)."""
    passes = [p for p in PASS_ORDER if any(p in r.passes for r in records)]
    unit, factor = throughput_unit(records)
    shared = {
        column: values.pop()
        for column in SHAREABLE
        if len(records) > 1 and len(values := {getattr(r, column) for r in records}) == 1
    }
    said = ", ".join(f"{column} {value}" for column, value in shared.items())
    table = Table(title=f"{title}: {said}" if said else title, show_lines=False)
    columns = [c for c in SHAREABLE if c not in shared] + ["seqlen", "status"]
    for column in columns:  # folded, never cut: "causal_do…" says nothing
        table.add_column(column, justify="right" if column == "seqlen" else "left", overflow="fold")
    for p in passes:
        table.add_column(f"{p} time", justify="right", no_wrap=True)
        table.add_column(f"{p} {unit}", justify="right", no_wrap=True)
    planned = any(r.predicted_hardware for r in records)
    if planned:  # measured / predicted throughput per pass (lcab.plan.record_prediction)
        table.add_column(
            f"vs plan {'/'.join(p for p in passes if p != 'fwd_bwd')}",
            justify="right",
            no_wrap=True,
        )
    # clock, power, share of the peak: where a device reports power or has a known peak
    watched = any(
        r.pass_result(p).power_w is not None or r.pass_result(p).peak_share is not None
        for r in records
        for p in passes
    )
    if watched:
        table.add_column("clock power peak", justify="right", no_wrap=True)
    notes: list[str] = []
    table.add_column("note", justify="right")
    for r in records:
        style = STATUS_STYLE.get(r.status, "")
        row = [getattr(r, c) for c in SHAREABLE if c not in shared]
        row += [seqlen_text(r), f"[{style}]{r.status}[/]"]
        for p in passes:
            res = r.pass_result(p)
            if res.status in ("ok", "numerics_mismatch"):
                tflops = None if res.tflops is None else res.tflops * factor
                row += [duration(res.ms_p50), rate(tflops)]
            else:
                row += [res.status if p in r.passes else "", ""]
        if planned:
            row.append(vs_plan(r, passes))
        if watched:
            row.append(device_text(r, passes))
        note = note_of(r)
        if note and note not in notes:
            notes.append(note)
        row.append(f"[{notes.index(note) + 1}]" if note else "")
        table.add_row(*row)
    return table, notes


def print_table(
    records: Sequence[RunRecord], title: str = "lcab results", out: Console | None = None
) -> None:
    """Print the table of ``records`` and, under it, each of its notes once."""
    out = out or console()
    table, notes = records_table(records, title)
    out.print(table)
    for number, note in enumerate(notes, 1):
        out.print(f"[{number}] {note}", markup=False, highlight=False, soft_wrap=False)


def record_line(r: RunRecord) -> str:
    """One record in one line, for a log: length, status, each pass's time and rate, its note."""
    unit, factor = throughput_unit([r])
    parts = [f"seqlen {r.seqlen:,}: {r.status}"]
    for p in r.passes:
        res = r.pass_result(p)
        if res.status in ("ok", "numerics_mismatch"):
            value = None if res.tflops is None else res.tflops * factor
            parts.append(f"{p} {duration(res.ms_p50)} {rate(value)} {unit}")
        else:
            parts.append(f"{p} {res.status}")
    note = note_of(r)
    return ", ".join(parts) + (f" ({note})" if note else "")


def frontier_line(r: RunRecord) -> str | None:
    """A ``seqlen=frontier`` record in one line: what fits, what did not, what was predicted.

    A search a probe ended otherwise than ``ok`` or ``oom`` says where and how it stopped: its
    longest fitting length is then no memory limit.
    """
    if r.frontier_bracket is None:
        return None
    fits, fails = r.frontier_bracket
    what = f"{r.kernel}/{r.cp}/{r.mask}"
    stop = next(
        (p for p in r.frontier_probes or [] if p.get("status") not in ("ok", "oom", None)), None
    )
    stopped = f"; search stopped at {stop['seqlen']:,} ({stop['status']})" if stop else ""
    if fits is None:
        if fails is None:
            return f"frontier {what}: no length ran{stopped}"
        return f"frontier {what}: nothing fits (the first probe, {fails:,} tokens, did not)"
    per_device = f" ({fits // r.world_size:,}/device)" if r.world_size > 1 else ""
    above = (f", {fails:,} did not" if fails is not None else "") + stopped
    above = above or " (the search's maximum)"
    text = f"frontier {what}: {fits:,} tokens{per_device} fit{above}"
    budget = r.frontier_budget_gib
    if budget is not None:
        text += f" in {budget:g} GiB per rank"
    if r.frontier_predicted_tokens:
        ratio = r.frontier_predicted_ratio
        text += f"; planner {r.frontier_predicted_tokens:,} ({ratio:.2f}x)" if ratio else ""
    return text
