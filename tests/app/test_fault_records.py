"""Records survive the faults of real runs: a record cut mid-line, a disk that fills.

Each test runs the real CLI (``python -m lcab.main``) and breaks what a real fault breaks: the
last line of ``records.jsonl`` cut in half (a job killed while writing), or an output folder on
a small tmpfs that fills before the first record or after the last. The tmpfs tests mount one
(root only; skipped, with the reason, where the machine cannot mount) and unmount it at the end.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env, read_jsonl, run_lcab

pytestmark = pytest.mark.slow

PAGE = 4096
"""tmpfs counts space in pages: every non-empty file takes whole pages."""


def pages(size: int) -> int:
    return math.ceil(size / PAGE)


def test_a_torn_last_record_is_set_aside_and_resume_runs_its_length_again(tmp_path):
    run = tmp_path / "run"
    first = run_lcab("debug=default", f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    path = run / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2
    lengths = [json.loads(line)["seqlen"] for line in lines]
    torn = lines[1][: len(lines[1]) // 2]
    path.write_bytes(lines[0] + torn)  # killed while writing the second record

    again = run_lcab("debug=default", "resume=true", f"hydra.run.dir={run}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    said = [line for line in again.stderr.splitlines() if "torn last line" in line]
    assert len(said) == 1 and "records.jsonl.torn" in said[0]
    records = read_jsonl(path)
    assert [r["seqlen"] for r in records] == lengths
    assert all(r["status"] == "ok" for r in records), [r["reasons"] for r in records]
    assert path.read_bytes().startswith(lines[0])  # the settled length was kept, not rerun
    assert (run / "records.jsonl.torn").read_bytes() == torn + b"\n"

    report = subprocess.run(
        [sys.executable, "-m", "lcab.report", "build", str(run)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert (run / "report" / "index.html").exists()


def test_the_report_builds_from_a_folder_whose_last_record_is_torn(tmp_path):
    run = tmp_path / "run"
    first = run_lcab("debug=default", f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    path = run / "records.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 300])  # the second record lost its end
    report = subprocess.run(
        [sys.executable, "-m", "lcab.report", "build", str(run)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "the last line is torn" in report.stderr and "Traceback" not in report.stderr
    assert path.read_bytes() == data[: len(data) - 300]  # the reader left the file alone


@contextmanager
def tmpfs(where: Path, size: int, *options: str) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``where`` (unmounted at the end)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            ",".join([f"size={size}", *options]),
            f"lcab-test-{uuid.uuid4().hex[:8]}",
            str(where),
        ],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"this machine cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)
        if os.path.ismount(where):
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def footprint(tmp_path: Path, *args: str) -> dict[str, int]:
    """The sizes one ``debug=default`` run writes, measured on an ordinary disk."""
    run = tmp_path / "reference"
    done = run_lcab("debug=default", *args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    hydra = sum(pages(p.stat().st_size) for p in (run / ".hydra").iterdir())
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    return {
        "hydra_pages": hydra + pages((run / "main.log").stat().st_size),
        "first_record": len(lines[0]),
        "records_pages": pages(sum(len(line) for line in lines)),
        "csv": (run / "records.csv").stat().st_size,
    }


BIG_RECORDS = "study=" + "x" * 2500
"""A longer study name (kept in every record, not in the folder name): a record (7.2 KB with its
telemetry, energy-window and frontier fields, 9.7 KB with this name) then takes three pages with
room to spare either side, whatever its timings print as."""


def test_a_disk_with_no_room_for_one_record_ends_in_one_line_and_exit_1(tmp_path):
    sizes = footprint(tmp_path, BIG_RECORDS)
    assert 2 * PAGE + 1000 < sizes["first_record"] < 3 * PAGE - 1000
    size = (sizes["hydra_pages"] + 1) * PAGE  # Hydra's files, and one page: a third of a record
    with tmpfs(tmp_path / "full", size) as disk:
        run = disk / "run"
        done = run_lcab("debug=default", BIG_RECORDS, f"hydra.run.dir={run}", cwd=tmp_path)
        written = (run / "records.jsonl").read_bytes() if (run / "records.jsonl").exists() else b""
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    said = [line for line in done.stderr.splitlines() if "No space left" in line]
    assert len(said) == 1 and str(run / "records.jsonl") in said[0]
    assert written == b""  # nothing half-written
    unsaved = json.loads(done.stdout.strip().splitlines()[-1])  # the measurement, not lost
    assert unsaved["status"] == "ok" and unsaved["seqlen"] > 0


def test_a_disk_with_room_for_the_records_only_keeps_them_whole_and_no_cut_csv(tmp_path):
    sizes = footprint(tmp_path)
    size = (sizes["hydra_pages"] + sizes["records_pages"] + 1) * PAGE
    assert sizes["csv"] > PAGE + 1000  # the CSV needs more than the spare page
    with tmpfs(tmp_path / "full", size) as disk:
        run = disk / "run"
        done = run_lcab("debug=default", f"hydra.run.dir={run}", cwd=tmp_path)
        records = read_jsonl(run / "records.jsonl")
        names = sorted(p.name for p in run.iterdir())
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)  # freed
        rebuilt = subprocess.run(
            [sys.executable, "-m", "lcab.records", str(run)],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=300,
        )
        csv_lines = (run / "records.csv").read_text().splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    said = [line for line in done.stderr.splitlines() if "No space left" in line]
    assert len(said) == 1 and "records.csv" in said[0] and "python -m lcab.records" in said[0]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)
    assert "records.csv" not in names and not [n for n in names if n.endswith(".tmp")]
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert len(csv_lines) == 1 + len(records)  # header + one row per record


def test_a_read_only_output_folder_ends_in_one_line_and_exit_1(tmp_path):
    with tmpfs(tmp_path / "ro", 1 << 20, "ro") as disk:
        single = run_lcab("debug=default", f"hydra.run.dir={disk / 'run'}", cwd=tmp_path)
        sweep = run_lcab(
            "-m",
            "debug=default",
            "kernel=ranges,sparse",
            f"hydra.sweep.dir={disk / 'sweep'}",
            cwd=tmp_path,
        )
        left = list(disk.iterdir())
    for done in (single, sweep):
        assert done.returncode == 1, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        (line,) = [line for line in done.stderr.splitlines() if line.startswith("lcab:")]
        assert str(disk) in line and "read-only file system" in line
    assert left == []
