"""A disk with no room when a run starts: one line naming the folder, exit code 1, no traceback.

Hydra writes ``.hydra/*.yaml`` (and a sweep's ``multirun.yaml``) before lcab's code runs; on a
full disk its own report is a traceback. Each test mounts a tiny tmpfs (root only; skipped with
the reason elsewhere, as in ``test_fault_records``): 12 KiB, too small for Hydra's files, and
one filled to the last page before the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.app.test_fault_records import PAGE, tmpfs
from tests.helpers.cli import run_lcab

pytestmark = pytest.mark.slow


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("lcab:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_a_disk_too_small_for_hydras_files_ends_in_one_line_and_exit_1(tmp_path):
    with tmpfs(tmp_path / "small", 3 * PAGE) as disk:
        run = disk / "run"
        done = run_lcab("debug=default", f"hydra.run.dir={run}", cwd=tmp_path)
        records = (run / "records.jsonl").exists()
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_line(done.stderr)
    assert f"cannot write to {run}: No space left on device" in line
    assert ".hydra/" in line  # which of Hydra's files
    assert not records


def _fill(disk: Path) -> None:
    """Fill ``disk`` to its last byte."""
    with open(disk / "fill", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * PAGE)
        except OSError:
            pass
    stats = os.statvfs(disk)
    assert stats.f_bavail == 0


@pytest.mark.parametrize("multirun", [False, True], ids=["run", "sweep"])
def test_an_already_full_disk_ends_in_one_line_and_exit_1(tmp_path, multirun):
    with tmpfs(tmp_path / "full", 4 * PAGE) as disk:
        _fill(disk)
        if multirun:
            folder = disk / "sweep"
            args = ["-m", "debug=default", "kernel=ranges,sparse", f"hydra.sweep.dir={folder}"]
        else:
            folder = disk / "run"
            args = ["debug=default", f"hydra.run.dir={folder}"]
        done = run_lcab(*args, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"cannot write to {folder}: No space left on device" in _one_line(done.stderr)
