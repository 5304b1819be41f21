"""`load_records`: the records of sweeps, run folders or records files as one DataFrame.

The one way from records on disk to anything tabular (the report, notebooks). One row is one
record (one cell at one length) with the `RunRecord.measured_flat` columns (times and TFLOP/s
empty for ranks that shared a GPU), plus ``series`` (the kernel, or ``<cp>/<kernel>``: what a
line stands for), ``variant`` (the settings that tell apart rows that would share a point,
such as two dtypes), ``source`` (the records file) and ``run`` (the name given to its input,
``build base=A new=B``). A sweep's merged root copy is not read beside its job files, and a
record read twice is kept once.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, read_records

SERIES = "series"
VARIANT = "variant"
SOURCE = "source"
RUN = "run"

POINT_KEY = ("series", "mask", "world_size", "seqlen")
"""What makes one point of a plot; rows sharing it are told apart by ``variant``."""
VARIANT_CANDIDATES = (
    *(RUN, "dtype", "heads_q", "heads_kv", "head_dim", "device_name", "nodes", "cp_balance"),
    *("mask_samples", "sweep_id"),
)
"""Settings that may tell apart rows sharing a `POINT_KEY`, in the order they are tried."""
_SAME_RECORD = ("run_id", "seqlen", "created_at", "kernel", "cp", "mask")


class BadInputError(ValueError):
    """An input path does not exist, holds no records, or has a line that is not a record."""


def record_files(path: Path) -> list[Path]:
    """The records files of ``path``: itself, or a folder's leaf ones (not a sweep's merge)."""
    if not path.exists():
        raise BadInputError(
            f"{path}: no such file or folder (expected a sweep or run folder, or a "
            f"{RECORDS_FILE} file)"
        )
    if path.is_file():
        return [path]
    found = sorted(path.rglob(RECORDS_FILE))
    folders = {f.parent for f in found}
    leaves = [f for f in found if not any(d != f.parent and f.parent in d.parents for d in folders)]
    if not leaves:
        raise BadInputError(
            f"{path}: no {RECORDS_FILE} in this folder or below it (expected a sweep or run "
            f"folder written by `python -m lcab.main`)"
        )
    return leaves


def finite(value: Any) -> float | None:
    """``value`` as a float if it is a finite number (numpy's too; booleans are not), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def series_name(kernel: str, cp: str) -> str:
    """The ``series`` of a record: its kernel, or ``<cp>/<kernel>`` under context parallelism."""
    return kernel if cp == "none" else f"{cp}/{kernel}"


def load_records(paths: Path | str | Sequence[Path | str]) -> pd.DataFrame:
    """One row per record under ``paths``, sorted by mask, series, world size and length.

    ``paths``: sweep or run folders or records files, in any mix; `BadInputError` names a bad
    path or line.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise BadInputError("no input: give at least one sweep folder, run folder or records file")
    rows: list[dict[str, Any]] = []
    seen_files: set[Path] = set()
    for given in paths:
        name, path = named_input(given)
        count = 0
        for file in record_files(path):
            resolved = file.resolve()
            try:
                records = read_records(file)
            except ValueError as err:
                raise BadInputError(
                    f"{err} (expected lcab records, one JSON object a line)"
                ) from err
            count += len(records)
            if resolved in seen_files:
                continue
            seen_files.add(resolved)
            rows += [_row(record, file, name) for record in records]
        if count == 0:
            raise BadInputError(f"{path}: its {RECORDS_FILE} file(s) hold no records")
    frame = pd.DataFrame(rows)
    # one record read from two files (a job's and a merged copy): the first file's is kept
    first = frame.groupby(list(_SAME_RECORD), dropna=False, sort=False)[SOURCE].transform("first")
    frame = frame[frame[SOURCE] == first].copy()
    frame[VARIANT] = variant_labels(frame)
    order = ["mask", SERIES, "world_size", VARIANT, "seqlen"]
    frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
    named = [named_input(p)[0] for p in paths]
    frame.attrs[RUN] = list(dict.fromkeys(n for n in named if n))  # in the order given
    return frame


def _row(record: RunRecord, file: Path, name: str) -> dict[str, Any]:
    row = record.measured_flat()
    row[SERIES] = series_name(record.kernel, record.cp)
    row[SOURCE] = str(file)
    row[RUN] = name
    return row


def named_input(given: Path | str) -> tuple[str, Path]:
    """(name, path) of an input: ``NAME=PATH`` names its records, a plain path is unnamed.

    A string is read as ``NAME=PATH`` only when it is not itself an existing path and ``NAME``
    is a plain word (letters, digits, ``-``, ``_``, ``.``): a folder whose name holds ``=`` (a
    Hydra job folder, ``0_kernel=ranges``) stays a path.
    """
    text = str(given)
    name, sep, rest = text.partition("=")
    if sep and not Path(text).exists() and name and all(c.isalnum() or c in "-_." for c in name):
        return name, Path(rest)
    return "", Path(text)


def variant_labels(frame: pd.DataFrame) -> pd.Series:
    """Per row, the settings that separate it from rows at the same point (``""`` if none).

    Candidates (`VARIANT_CANDIDATES`) are added one at a time, each only if some rows still
    share a point and the candidate differs among them; the chosen ones label every row, so
    the labels of one plot are consistent.
    """
    values = pd.DataFrame(
        {c: _candidate(frame, c).astype(str) for c in VARIANT_CANDIDATES}, index=frame.index
    )
    key = frame[list(POINT_KEY)].astype(str)
    chosen: list[str] = []
    for column in VARIANT_CANDIDATES:
        current = pd.concat([key, values[chosen]], axis=1)
        if not current.duplicated(keep=False).any():
            break
        clashing = current.duplicated(keep=False)
        groups = values.loc[clashing, column].groupby(
            [current.loc[clashing, c] for c in current.columns]
        )
        if (groups.nunique() > 1).any():
            chosen.append(column)
    if not chosen:
        return pd.Series("", index=frame.index)
    return (
        values[chosen]
        .apply(lambda row: ", ".join(f"{c}={row[c]}" for c in chosen), axis=1)
        .astype(str)
    )


def _candidate(frame: pd.DataFrame, column: str) -> pd.Series:
    if column == "cp_balance":
        return frame["cp_params"].map(lambda p: p.get("balance") if isinstance(p, dict) else None)
    return frame[column]
