"""``python -m lcab.records <folder>``: rebuild a folder's record views from its JSONL.

A run folder gets its ``records.csv`` again from ``records.jsonl``; a sweep folder (job
sub-folders with records) gets the merged ``records.jsonl`` and ``records.csv`` at its root —
what the end of a run writes, for when that failed (a full disk) or the records changed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lcab.records.sinks import (
    CSV_FILE,
    RECORDS_FILE,
    RecordWriteError,
    iter_record_files,
    merge_records,
    read_records,
    write_csv,
)


def main(argv: list[str] | None = None) -> int:
    """Entry point; 0 when the views were written, 1 when they could not be, 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m lcab.records", description=__doc__)
    parser.add_argument("folder", type=Path, help="a run folder or a sweep folder")
    folder: Path = parser.parse_args(argv).folder
    try:
        if next(iter_record_files(folder), None) is not None:
            merged, csv, count = merge_records(folder)
            print(f"lcab: merged {count} records -> {merged} and {csv.name}")
        elif (folder / RECORDS_FILE).is_file():
            records = read_records(folder / RECORDS_FILE)
            csv = write_csv(records, folder / CSV_FILE)
            print(f"lcab: {len(records)} records -> {csv}")
        else:
            print(f"lcab: no {RECORDS_FILE} in or below {folder}", file=sys.stderr)
            return 2
    except RecordWriteError as err:
        print(f"lcab: cannot write {err.path}: {err.cause}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
