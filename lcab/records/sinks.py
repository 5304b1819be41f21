"""Where records go: a JSONL file (the source of truth), a CSV view, and optionally W&B.

Only rank 0 writes. Each record is flushed and fsynced as soon as it exists, so a job killed
mid-sweep keeps every record it finished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lcab.records.schema import RunRecord

RECORDS_FILE = "records.jsonl"
CSV_FILE = "records.csv"


class JsonlSink:
    """Appends records to a JSONL file, one line each, durable on return."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: RunRecord) -> None:
        """Append and flush one record."""
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(record.to_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_records(path: str | Path) -> list[RunRecord]:
    """All records of a JSONL file (blank lines ignored).

    Raises:
        ValueError: a line is not JSON or has an unsupported schema version (line number given).

    """
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(RunRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError) as err:
            raise ValueError(f"{path}:{number}: {err}") from err
    return out


def write_records(path: str | Path, records: Iterable[RunRecord]) -> Path:
    """Replace ``path`` with exactly ``records``, atomically (readers never see half a file)."""
    out = Path(path)
    tmp = out.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(record.to_json() + "\n")
    tmp.replace(out)
    return out


def iter_record_files(root: str | Path) -> Iterator[Path]:
    """Every ``records.jsonl`` below ``root`` except ``root/records.jsonl`` itself, sorted."""
    root = Path(root)
    for path in sorted(root.rglob(RECORDS_FILE)):
        if path.parent != root:
            yield path


def write_csv(records: Iterable[RunRecord], path: str | Path) -> Path:
    """A CSV view of records (pass fields flattened; nested values as JSON)."""
    import pandas as pd

    rows = []
    for record in records:
        flat = record.flat()
        rows.append({k: _cell(v) for k, v in flat.items()})
    frame = pd.DataFrame(rows)
    out = Path(path)
    frame.to_csv(out, index=False)
    return out


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def merge_records(root: str | Path) -> tuple[Path, Path, int]:
    """Merge every job's records below ``root`` into ``root/records.jsonl`` and ``records.csv``."""
    root = Path(root)
    records = [r for path in iter_record_files(root) for r in read_records(path)]
    records.sort(key=lambda r: (r.job_num if r.job_num is not None else -1, r.seqlen))
    merged = write_records(root / RECORDS_FILE, records)
    csv = write_csv(records, root / CSV_FILE)
    return merged, csv, len(records)
