"""Console output with rich: a progress bar while a cell runs, a compact table when it ends."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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
    table.add_column("note")
    for r in records:
        style = _STATUS_STYLE.get(r.status, "")
        row = [r.kernel, r.cp, r.mask, f"{r.seqlen:,}", f"[{style}]{r.status}[/]"]
        for p in passes:
            res = r.pass_result(p)
            if res.status == "ok" or res.status == "numerics_mismatch":
                row += [_fmt(res.ms_p50, 4), _fmt(res.tflops, 3)]
            else:
                row += [res.status if p in r.passes else "", ""]
        note = r.reasons[0] if r.reasons else ""
        row.append(note if len(note) <= 70 else note[:67] + "...")
        table.add_row(*row)
    return table


def print_records(records: Sequence[RunRecord], title: str = "lcab results") -> None:
    """Print the results table.

    Not on a terminal (logs, CI, SLURM output files) rich would wrap the table at 80 columns and
    make it unreadable, so it gets room for every column instead.
    """
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(records_table(records, title))
