"""Console output with rich: a progress bar while a cell runs, its results table when it ends.

The table itself (units, notes, width) is `lcab.records.table`'s, shared with the sweep's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lcab.cell import few_tokens_warning
from lcab.records.schema import RunRecord
from lcab.records.table import console, frontier_line, print_table


@contextmanager
def progress_bar(total: int, title: str, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A progress bar over ``total`` steps (on a terminal only); yields a callable advancing it."""
    if not enabled or not console().is_terminal:
        yield lambda description: None
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
        yield lambda description: progress.update(task, description=description, advance=1)


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


def print_records(records: Sequence[RunRecord], title: str = "lcab results") -> None:
    """Print the results table with its notes (`lcab.records.table`), then the token warnings."""
    out = console()
    print_table(records, title, out)
    for record in records:
        line = frontier_line(record)
        if line is not None:
            out.print(line, markup=False, highlight=False)
    for line in token_warnings(records):
        out.print(line, style="yellow", markup=False, highlight=False)
