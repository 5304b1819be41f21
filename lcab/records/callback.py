"""Hydra callback merging a run's or a multirun's per-job records at its root.

``on_multirun_end`` runs on the submitting machine after every job (SLURM too): the merged
records appear at the sweep root and one table ends the sweep (`lcab.records.summary`). A file
that cannot be written is named in one line and the run exits 1 (Hydra would only warn);
``python -m lcab.records <folder>`` rebuilds the views later.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from typing_extensions import override

from lcab.records.sinks import (
    CSV_FILE,
    RECORDS_FILE,
    RecordWriteError,
    merge_records,
    read_records,
    write_csv,
)
from lcab.records.summary import print_sweep_summary

_FAILURES: list[str] = []


def write_failures() -> list[str]:
    """The files this process's callbacks could not write (``python -m lcab.main`` exits 1)."""
    return list(_FAILURES)


def _report(err: RecordWriteError, folder: Path, whole: str) -> None:
    _FAILURES.append(str(err.path))
    print(
        f"lcab: cannot write {err.path}: {err.cause}; {whole} - free the folder, then rebuild "
        f"with: python -m lcab.records {folder}",
        file=sys.stderr,
    )


class MergeRecords(Callback):
    """Write merged records (JSONL + CSV) at the sweep root, or a CSV next to a single run's."""

    @override
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        if root.exists():
            try:
                merged, csv, count = merge_records(root)
            except RecordWriteError as err:
                _report(err, root, "each job's records.jsonl is whole")
                return
            print_sweep_summary(root, merged, csv)
            print(f"[lcab] merged {count} records -> {merged} and {csv.name}")

    @override
    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        path = Path(config.hydra.run.dir) / RECORDS_FILE
        if path.exists():
            try:
                write_csv(read_records(path), path.parent / CSV_FILE)
            except RecordWriteError as err:
                _report(err, path.parent, f"the records are whole in {path}")
