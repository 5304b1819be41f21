"""Console output with rich: a progress bar while a cell runs, a compact table when it ends."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lcab.cell import few_tokens_warning, tokens_per_rank
from lcab.records.schema import RunRecord

_STATUS_STYLE = {
    "ok": "green",
    "skipped": "yellow",
    "numerics_mismatch": "magenta",
    "oom": "red",
    "timeout": "red",
    "error": "bold red",
}


class _Reporter:
    def __init__(self, progress: Progress | None, task: Any) -> None:
        self.progress, self.task = progress, task

    def __call__(self, description: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=description, advance=1)


@contextmanager
def progress_bar(total: int, title: str, enabled: bool = True) -> Iterator[_Reporter]:
    """A progress bar over ``total`` steps; yields a callable advancing it with a description."""
    if not enabled:
        yield _Reporter(None, None)
        return
    progress = Progress(
        TextColumn(f"[bold]{title}[/] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
    )
    with progress:
        task = progress.add_task("starting", total=total)
        yield _Reporter(progress, task)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def records_table(records: Sequence[RunRecord], title: str = "lcab results") -> Table:
    """One row per record: axes, status, and p50 time / TFLOP/s per requested pass."""
    passes = [p for p in ("fwd", "bwd", "fwd_bwd") if any(p in r.passes for r in records)]
    table = Table(title=title, show_lines=False)
    for col in ("kernel", "cp", "mask", "seqlen", "status"):
        table.add_column(col, justify="right" if col == "seqlen" else "left")
    for p in passes:
        table.add_column(f"{p} ms", justify="right")
        table.add_column(f"{p} TFLOP/s", justify="right")
    planned = any(r.predicted_hardware for r in records)
    if planned:  # measured / predicted throughput per pass (lcab.plan.record_prediction)
        table.add_column("vs plan", justify="right")
    table.add_column("note")
    for r in records:
        style = _STATUS_STYLE.get(r.status, "")
        row = [r.kernel, r.cp, r.mask, _seqlen(r), f"[{style}]{r.status}[/]"]
        for p in passes:
            res = r.pass_result(p)
            if res.status == "ok" or res.status == "numerics_mismatch":
                row += [_fmt(res.ms_p50, 4), _fmt(res.tflops, 3)]
            else:
                row += [res.status if p in r.passes else "", ""]
        if planned:
            row.append(_vs_plan(r, passes))
        note = r.reasons[0] if r.reasons else (r.prediction_warning or "")
        if r.shared_device:  # ranks shared a GPU: the times are shown, but measure nothing
            note = "shared GPU: times not a measurement" + (f"; {note}" if note else "")
        row.append(note if len(note) <= 70 else note[:67] + "...")
        table.add_row(*row)
    return table


def _seqlen(r: RunRecord) -> str:
    """``8,192 (1,024/rank)``: the length, and what each rank holds of it under CP."""
    if r.cp == "none" or r.world_size <= 1:
        return f"{r.seqlen:,}"
    return f"{r.seqlen:,} ({tokens_per_rank(r.seqlen, r.world_size):,}/rank)"


def token_warnings(records: Sequence[RunRecord]) -> list[str]:
    """`lcab.cell.few_tokens_warning` for each CP cell among ``records`` (its lengths)."""
    cells: dict[tuple[str, ...], list[RunRecord]] = {}
    for r in records:
        if r.cp != "none":
            key = (r.kernel, r.cp, r.mask, str(r.world_size), r.device)
            cells.setdefault(key, []).append(r)
    out = []
    for (kernel, cp, mask, _, _), rs in cells.items():
        seqlens = sorted({r.seqlen for r in rs})
        warning = few_tokens_warning(seqlens, rs[0].world_size, rs[0].device)
        if warning:
            out.append(f"warning: {kernel} {cp} {mask}: {warning}")
    return out


def _vs_plan(r: RunRecord, passes: Sequence[str]) -> str:
    """``0.97x/1.1x``: each requested pass's measured / predicted throughput, red when flagged."""
    ratios = [r.pass_result(p).predicted_ratio for p in passes if p in r.passes]
    text = "/".join(f"{x:.2g}x" for x in ratios if x is not None)
    return f"[red]{text}[/]" if text and r.prediction_warning else text or "-"


def print_records(records: Sequence[RunRecord], title: str = "lcab results") -> None:
    """Print the results table.

    Not on a terminal (logs, CI, SLURM output files) rich would wrap the table at 80 columns and
    make it unreadable, so it gets room for every column instead.
    """
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(records_table(records, title))
    for line in token_warnings(records):
        console.print(line, style="yellow", markup=False, highlight=False)
