"""Where records go: a JSONL file (the source of truth), a CSV view, and optionally W&B.

Only rank 0 writes, each record in **one** ``write`` of its whole line, then fsynced. A line
torn mid-write (a kill, a full disk) is skipped by readers with one line (`read_records`) and
set aside by the next writer (`set_aside_torn_tail`), so ``resume=true`` runs its length again;
a failed write is cut back and raises `RecordWriteError`. The CSV is rebuilt whole and renamed
into place, never left cut short.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lcab.records.schema import RunRecord

RECORDS_FILE = "records.jsonl"
CSV_FILE = "records.csv"
TORN_SUFFIX = ".torn"
"""A torn last line of ``records.jsonl`` is moved to ``records.jsonl.torn`` (appended)."""


class RecordWriteError(OSError):
    """A records file could not be written; the message names the path and the cause."""

    def __init__(self, path: Path, err: OSError) -> None:
        cause = err.strerror or str(err)
        super().__init__(err.errno, f"{path}: {cause}")
        self.path, self.cause = path, cause


def _whole(line: str) -> bool:
    """Whether ``line`` is one complete JSON value."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _torn_tail(data: bytes) -> int | None:
    """Offset where a torn last line (no newline, not complete JSON) starts, else None."""
    if not data or data.endswith(b"\n"):
        return None
    start = data.rfind(b"\n") + 1
    return None if _whole(data[start:].decode("utf-8", "replace")) else start


def read_records(path: str | Path) -> list[RunRecord]:
    """All records of a JSONL file (blank lines ignored; a torn last line skipped, with a line).

    Raises ValueError: a line other than the last is not JSON, or a record has an unsupported
    schema version (line number given).
    """
    data = Path(path).read_bytes()
    torn = _torn_tail(data)
    if torn is not None:
        print(
            f"lcab: {path}: the last line is torn ({len(data) - torn} bytes cut mid-record, "
            "e.g. by a kill or a full disk); it is not read, and its length counts as not run",
            file=sys.stderr,
        )
        data = data[:torn]
    out = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(RunRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError) as err:
            raise ValueError(f"{path}:{number}: {err}") from err
    return out


def set_aside_torn_tail(path: str | Path) -> Path | None:
    """Move a torn last line of ``path`` to ``<path>.torn``; end the file with a newline.

    Returns the ``.torn`` file when a tail was moved. Only a writer calls this.

    Raises RecordWriteError: the file or its folder cannot be written.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise RecordWriteError(path, err) from err
    if not data or data.endswith(b"\n"):
        return None
    torn = _torn_tail(data)
    aside = path.with_name(path.name + TORN_SUFFIX)
    try:
        with path.open("r+b") as fh:
            if torn is None:  # a whole record without its newline
                fh.seek(0, os.SEEK_END)
                fh.write(b"\n")
            else:
                with aside.open("ab") as out:
                    out.write(data[torn:] + b"\n")
                fh.truncate(torn)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise RecordWriteError(path, err) from err
    if torn is None:
        return None
    print(
        f"lcab: {path}: a torn last line ({len(data) - torn} bytes) was set aside in "
        f"{aside.name}; its length runs again",
        file=sys.stderr,
    )
    return aside


def append_line(path: Path, line: str) -> None:
    """Append ``line`` + newline in one ``write``, fsynced; on failure cut the file back.

    Raises RecordWriteError: the file could not be opened or the line not written whole.
    """
    data = (line + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as err:
        raise RecordWriteError(path, err) from err
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            while written < len(data):  # cut short (a full disk): the next write says why
                more = os.write(fd, data[written:])
                if more == 0:
                    raise OSError(errno.EIO, f"wrote {written} of {len(data)} bytes")
                written += more
            os.fsync(fd)
        except OSError as err:
            # no half line left behind (if even this fails, readers skip the torn tail and
            # the next writer sets it aside)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise RecordWriteError(path, err) from err
    finally:
        os.close(fd)


class JsonlSink:
    """Appends records to a JSONL file, one whole line each, durable on return."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._checked = False

    def write(self, record: RunRecord) -> None:
        """Append one record (a torn tail left by an earlier run is set aside first).

        Raises RecordWriteError: the folder or file cannot be written (full, read-only, gone).
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RecordWriteError(self.path, err) from err
        if not self._checked:
            set_aside_torn_tail(self.path)
            self._checked = True
        append_line(self.path, record.to_json())


def _replace(out: Path, write: Any) -> Path:
    """Write ``out`` through a temporary file renamed over it; nothing half-written remains.

    Raises RecordWriteError: the file could not be written whole (the old one, if any, stays).
    """
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        write(tmp)
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise RecordWriteError(out, err) from err
    return out


def write_records(path: str | Path, records: Iterable[RunRecord]) -> Path:
    """Replace ``path`` with exactly ``records``, atomically (readers never see half a file)."""
    text = "".join(record.to_json() + "\n" for record in records)
    return _replace(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def iter_record_files(root: str | Path) -> Iterator[Path]:
    """Every ``records.jsonl`` below ``root`` except ``root/records.jsonl`` itself, sorted."""
    root = Path(root)
    for path in sorted(root.rglob(RECORDS_FILE)):
        if path.parent != root:
            yield path


def write_csv(records: Iterable[RunRecord], path: str | Path) -> Path:
    """A CSV view of records (pass fields flattened; nested values as JSON), replaced whole.

    Raises RecordWriteError: no room or no permission; no partial CSV is left behind.
    """
    import pandas as pd

    rows = []
    for record in records:
        flat = record.flat()
        rows.append({k: _cell(v) for k, v in flat.items()})
    frame = pd.DataFrame(rows)
    return _replace(Path(path), lambda tmp: frame.to_csv(tmp, index=False))


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
