"""The results table: one row per record, in the units of the machine, within the terminal.

Used after each cell (`lcab.bench.console`) and for a whole sweep (`lcab.records.summary`).
Readable where it is read: CPU-only records show GFLOP/s (any GPU record: TFLOP/s); long texts
(skip reasons, off-the-plan warnings) are numbered notes below the table, each once (busy-host
ones shared); it fits the terminal (120 columns without one, e.g. SLURM logs): what every row
shares is said once in the title, and a table still too wide is split by kernel, then cp.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from lcab.cell import tokens_per_rank
from lcab.flops import PASSES
from lcab.records.schema import BUSY_STEAL, RunRecord, busy_host

WIDTH_OFF_TERMINAL = 120
"""Columns a table may take where no terminal says how many there are."""
SHAREABLE = ("kernel", "cp", "mask")
"""Columns said once in the title when every row of a table has the same value; the order a
table too wide is split in."""
STATUS_STYLE = {
    "ok": "green",
    "skipped": "yellow",
    "numerics_mismatch": "magenta",
    "oom": "red",
    "timeout": "red",
    "error": "bold red",
}
SHARED_GPU = "shared GPU: times not a measurement"


def console() -> Console:
    """A console as wide as the terminal, or `WIDTH_OFF_TERMINAL` columns off one."""
    found = Console()
    return found if found.is_terminal else Console(width=WIDTH_OFF_TERMINAL)


def throughput_unit(devices: Iterable[str]) -> tuple[str, float]:
    """(unit, factor from TFLOP/s): GFLOP/s when every record ran on a CPU."""
    found = set(devices)
    return ("GFLOP/s", 1e3) if found == {"cpu"} else ("TFLOP/s", 1.0)


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


def per_rank(r: RunRecord) -> str:
    """``1,024``: the tokens each rank holds under CP (empty for one device)."""
    if r.cp == "none" or r.world_size <= 1:
        return ""
    return f"{tokens_per_rank(r.seqlen, r.world_size):,}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def explained_by_load(r: RunRecord) -> bool:
    """Whether the planner's warning blames the busy host (`busy_host`)."""
    said = busy_host(r)
    return bool(said and r.prediction_warning and r.prediction_warning.endswith(said))


def notes_of(r: RunRecord, busy: str = "") -> list[str]:
    """Everything the row's notes say, each once (``busy`` where the host explains a warning)."""
    by_reason: dict[str, list[str]] = {}
    for p in r.passes:
        res = r.pass_result(p)
        if res.status != "ok" and res.reason:
            by_reason.setdefault(res.reason, []).append(p)
    said = {f"{p}: {why}" for why, passes in by_reason.items() for p in passes} | set(by_reason)
    for text in r.reasons:
        if text not in said:
            by_reason.setdefault(_last_line(text), [])
    notes = [SHARED_GPU] if r.shared_device else []
    notes += [f"{', '.join(ps)}: {why}" if ps else why for why, ps in by_reason.items()]
    if r.prediction_warning:
        notes.append(busy if busy and explained_by_load(r) else r.prediction_warning)
    return notes


def busy_note(records: Sequence[RunRecord]) -> str:
    """One note for every length that ran off the plan while the host was busy (else empty)."""
    busy = [r for r in records if explained_by_load(r)]
    if not busy:
        return ""
    loads = sorted(r.host_load_start for r in busy if r.host_load_start is not None)
    steal = max(r.host_steal_share or 0.0 for r in busy)
    why = []
    if loads:
        span = f"{loads[0]:.2f}" + (f"-{loads[-1]:.2f}" if loads[-1] > loads[0] else "")
        why.append(f"load average {span} on {busy[0].host_cores} cores when the lengths began")
    if steal >= BUSY_STEAL:
        why.append(f"up to {steal:.0%} of CPU time stolen by the hypervisor")
    return (
        f"off the plan while the host was busy ({', '.join(why)}): these times measure the "
        "load as much as the kernel (each ratio: vs plan; each warning: its record)"
    )


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
    records: Sequence[RunRecord],
    title: str = "lcab results",
    notes: list[str] | None = None,
    busy: str = "",
) -> tuple[Table, list[str]]:
    """The table of ``records`` and the notes its rows point to (``[n]`` → ``notes[n-1]``).

    ``notes`` already numbered (an earlier part of a split table) are extended, not repeated.
    """
    notes = [] if notes is None else notes
    passes = [p for p in PASSES if any(p in r.passes for r in records)]
    unit, factor = throughput_unit(r.device for r in records)
    shared = {
        column: values.pop()
        for column in SHAREABLE
        if records and len(values := {getattr(r, column) for r in records}) == 1
    }
    given = set(re.split(r"[,:\s]+", title))  # a job's title already names its overrides
    pairs = [f"{column}={value}" for column, value in shared.items()]
    said = ", ".join(pair for pair in pairs if pair not in given)
    table = Table(
        title=": ".join(t for t in (title, said) if t),
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        show_edge=False,
    )
    columns = [c for c in SHAREABLE if c not in shared]
    ranks = any(per_rank(r) for r in records)
    for column in columns:
        table.add_column(column, no_wrap=True)
    table.add_column("seqlen", justify="right", no_wrap=True)
    if ranks:
        table.add_column("per\nrank", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for p in passes:
        table.add_column(f"{p}\ntime", justify="right", no_wrap=True)
        table.add_column(f"{p}\n{unit}", justify="right", no_wrap=True)
    planned = any(r.predicted_hardware for r in records)
    if planned:  # measured / predicted throughput per pass (lcab.plan.record_prediction)
        table.add_column(
            f"vs plan\n{'/'.join(p for p in passes if p != 'fwd_bwd')}",
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
        table.add_column("clock power\npeak", justify="right", no_wrap=True)
    table.add_column("note", no_wrap=True)
    for r in records:
        style = STATUS_STYLE.get(r.status, "")
        row = [getattr(r, c) for c in columns] + [f"{r.seqlen:,}"]
        row += [per_rank(r)] if ranks else []
        row.append(f"[{style}]{r.status}[/]")
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
        numbers = []
        for note in notes_of(r, busy):
            if note not in notes:
                notes.append(note)
            numbers.append(str(notes.index(note) + 1))
        row.append(f"\\[{','.join(numbers)}]" if numbers else "")
        table.add_row(*row)
    return table, notes


def fitting_tables(
    records: Sequence[RunRecord], title: str, out: Console, notes: list[str], busy: str = ""
) -> list[Table]:
    """The table of ``records``, split by kernel, then cp, until each part fits ``out``.

    ``notes`` gets the notes of the tables returned, numbered in their order.
    """
    trial = list(notes)
    table, _ = records_table(records, title, trial, busy)
    loose = [c for c in SHAREABLE if len({getattr(r, c) for r in records}) > 1]
    natural = Measurement.get(out, out.options.update_width(10_000), table).maximum
    if natural <= out.width or not loose:
        notes[:] = trial
        return [table]
    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(getattr(r, loose[0]), []).append(r)
    return [t for group in groups.values() for t in fitting_tables(group, "", out, notes, busy)]


def print_table(
    records: Sequence[RunRecord], title: str = "lcab results", out: Console | None = None
) -> None:
    """Print the table of ``records`` (split where too wide) and, under it, each note once."""
    out = out or console()
    notes: list[str] = []
    busy = busy_note(records)
    tables = fitting_tables(records, title, out, notes, busy)
    if len(tables) > 1:  # the parts' titles say what each shares
        out.print(title, style="bold", markup=False, highlight=False)
    for table in tables:
        out.print(table)
    for number, note in enumerate(notes, 1):
        out.print(f"[{number}] {note}", markup=False, highlight=False, soft_wrap=False)


def record_line(r: RunRecord, with_notes: bool = True) -> str:
    """One record in one line: length, status, each pass's time and rate, and its notes.

    A log has the notes; a progress line leaves them to the table.
    """
    unit, factor = throughput_unit([r.device])
    parts = [f"seqlen {r.seqlen:,}: {r.status}"]
    for p in r.passes:
        res = r.pass_result(p)
        if res.status in ("ok", "numerics_mismatch"):
            value = None if res.tflops is None else res.tflops * factor
            parts.append(f"{p} {duration(res.ms_p50)} {rate(value)} {unit}")
        else:
            parts.append(f"{p} {res.status}")
    notes = "; ".join(notes_of(r)) if with_notes else ""
    return ", ".join(parts) + (f" ({notes})" if notes else "")


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
