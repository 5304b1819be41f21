"""``python -m lcab.sweep status <sweep folder>``: the state of every cell of a sweep.

A cell is *pending*/*running* while SLURM says so, *finished* with its records' statuses, or
*failed* with the SLURM state when its job ended unsettled: one ``sacct`` call with the job ids
the launcher wrote (``slurm.json``), else the records alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lcab.launch.slurm_launcher import JOB_FILE
from lcab.records.sinks import RECORDS_FILE, read_records

_SETTLED = {"ok", "numerics_mismatch", "skipped"}


@dataclass(frozen=True)
class CellState:
    """One cell (job folder) of a sweep."""

    folder: str
    job_id: str | None
    slurm_state: str | None
    state: str
    records: str
    shape: str


def _sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Sacct's state of each job (first word), or {} when sacct is unavailable."""
    if not job_ids or shutil.which("sacct") is None:
        return {}
    try:
        out = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(job_ids)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    states = {}
    for line in out.splitlines():
        if "|" in line:
            job, state = line.split("|", 1)
            states[job.strip()] = state.split()[0] if state.strip() else "UNKNOWN"
    return states


def _state(slurm: str | None, counts: Counter[str], seqlens: int | None) -> str:
    if slurm in ("PENDING", "REQUEUED", "CONFIGURING"):
        return "pending"
    if slurm in ("RUNNING", "COMPLETING"):
        return "running"
    complete = bool(counts) and (seqlens is None or sum(counts.values()) >= seqlens)
    failed = set(counts) - _SETTLED
    if complete and not failed:
        return "finished"
    if failed or (slurm and slurm != "COMPLETED"):
        return f"failed ({slurm or ', '.join(sorted(failed))})"
    return "not started" if not counts else "incomplete"


def sweep_status(sweep: Path) -> list[CellState]:
    """The state of every job folder below ``sweep``."""
    folders = sorted(p.parent for p in sweep.glob("*/.hydra")) or sorted(
        p.parent for p in sweep.glob(f"*/{JOB_FILE}")
    )
    jobs = {f: json.loads((f / JOB_FILE).read_text()) for f in folders if (f / JOB_FILE).exists()}
    states = _sacct_states([str(j["job_id"]) for j in jobs.values()])
    out = []
    for folder in folders:
        job = jobs.get(folder)
        path = folder / RECORDS_FILE
        records = read_records(path) if path.exists() else []
        counts = Counter(r.status for r in records)
        job_id = str(job["job_id"]) if job else None
        slurm = states.get(job_id) if job_id else None
        seqlens = len(job["seqlens"]) if job else None
        shape = ""
        if job:
            s = job["shape"]
            shape = f"{s['nodes']}x{s['tasks_per_node']}, {s['timeout_min']} min"
        out.append(
            CellState(
                folder=folder.name,
                job_id=job_id,
                slurm_state=slurm,
                state=_state(slurm, counts, seqlens),
                records=", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "-",
                shape=shape,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m lcab.sweep``."""
    parser = argparse.ArgumentParser(prog="python -m lcab.sweep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="state of every cell of a sweep folder")
    status.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"lcab.sweep: {args.folder} is not a folder", file=sys.stderr)
        return 2
    cells = sweep_status(args.folder)
    if not cells:
        print(f"lcab.sweep: no job folders in {args.folder}", file=sys.stderr)
        return 2
    table = Table(title=f"{args.folder}: {len(cells)} cells")
    for column in ("cell", "SLURM job", "SLURM state", "state", "records", "shape"):
        table.add_column(column)
    for c in cells:
        table.add_row(c.folder, c.job_id or "-", c.slurm_state or "-", c.state, c.records, c.shape)
    Console(width=200).print(table)
    summary = Counter(c.state.split(" ")[0] for c in cells)
    print(", ".join(f"{n} {s}" for s, n in sorted(summary.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
