"""Hydra callback merging a run's or a multirun's per-job records at its root.

``on_multirun_end`` runs on the submitting machine once every job has finished (also with the
SLURM launcher), so the merged ``records.jsonl`` + ``records.csv`` appear at the sweep root, and
one table of every cell ends the sweep (`lcab.records.summary`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from typing_extensions import override

from lcab.records.sinks import CSV_FILE, RECORDS_FILE, merge_records, read_records, write_csv
from lcab.records.summary import print_sweep_summary


class MergeRecords(Callback):
    """Write merged records (JSONL + CSV) at the sweep root, or a CSV next to a single run's."""

    @override
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        if root.exists():
            merged, csv, count = merge_records(root)
            print_sweep_summary(root, merged, csv)
            print(f"[lcab] merged {count} records -> {merged} and {csv.name}")

    @override
    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        path = Path(config.hydra.run.dir) / RECORDS_FILE
        if path.exists():
            write_csv(read_records(path), path.parent / CSV_FILE)
