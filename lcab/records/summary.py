"""The end-of-sweep summary: one table of every cell's records, then where its results are.

The per-cell table (`lcab.records.table`) over every cell in job order, so a sweep reads at a
glance; below it the W&B runs, merged records, the report and ``wandb sync`` commands.
`summarise_sweep` gives each cell's statuses and headline for other views.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, read_records
from lcab.records.table import console as table_console
from lcab.records.table import print_table

WANDB_RUN_ID_FILE = "wandb-run-id"
"""Job-folder file holding the cell's W&B run id (written by `lcab.records.wandb_run`)."""


@dataclass(frozen=True)
class CellSummary:
    """One cell of a sweep, summarised from its records."""

    cell: str
    statuses: str
    headline: str
    wandb_run: str


def _headline(records: list[RunRecord]) -> str:
    ok = [r for r in records if r.status == "ok"]
    if not ok:
        return "-"
    best = max(ok, key=lambda r: r.seqlen)
    parts = [f"S={best.seqlen:,}"]
    if not best.timings_measured:  # ranks shared a GPU: a numerics check, no throughput
        return f"{parts[0]}, shared GPU (numerics only)"
    for p in ("fwd", "bwd"):
        tflops = best.pass_result(p).tflops
        if tflops is not None:
            parts.append(f"{p} {tflops:.3g} TFLOP/s")
    return ", ".join(parts)


def summarise_sweep(root: Path) -> list[CellSummary]:
    """A summary per job folder of ``root`` that holds records, in job order."""
    rows = []
    for path in sorted(root.glob(f"*/{RECORDS_FILE}"), key=lambda p: _job_number(p.parent.name)):
        records = read_records(path)
        counts = Counter(r.status for r in records)
        id_file = path.parent / WANDB_RUN_ID_FILE
        rows.append(
            CellSummary(
                cell=path.parent.name,
                statuses=", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "-",
                headline=_headline(records),
                wandb_run=id_file.read_text().strip() if id_file.exists() else "-",
            )
        )
    return rows


def _job_number(name: str) -> int:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def print_sweep_summary(
    root: Path, merged: Path, csv: Path, console: Console | None = None
) -> None:
    """Print one table of every cell's records, then where the sweep's results are."""
    console = console or table_console()
    files = sorted(root.glob(f"*/{RECORDS_FILE}"), key=lambda p: _job_number(p.parent.name))
    records = [record for path in files for record in read_records(path)]
    title = f"sweep {root.name}: {len(files)} cells, {len(records)} records"
    print_table(records, title, console)
    runs = [f"{row.cell} {row.wandb_run}" for row in summarise_sweep(root) if row.wandb_run != "-"]
    if runs:
        console.print(f"W&B runs: {'; '.join(runs)}", markup=False, highlight=False)
    console.print(f"records: {merged}  and  {csv}")
    console.print(f"report:  python -m lcab.report build {root}")
    offline = sorted(root.glob("*/wandb/offline-run-*"))
    if offline:
        console.print(
            f"W&B: {len(offline)} offline run folder(s); upload with: "
            f"wandb sync {root}/*/wandb/offline-run-*"
        )
