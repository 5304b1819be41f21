"""Where the slurm tier's own test cluster lives, and how the session's end knows to stop it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UP_SCRIPT = ROOT / "launchers" / "slurm_local.sh"
TEST_CLUSTER_DIR = Path(os.environ.get("LCAB_SLURM_TEST_DIR", "/tmp/lcab-slurm-tests"))
STARTED_MARK = ".started-by-pytest"
"""Written by the session that started the cluster, holding that session's id."""
SESSION_ENV = "LCAB_TEST_SESSION"
"""Set once by the controlling pytest process; workers inherit it."""


def stop_test_cluster() -> None:
    """Take down the cluster this session brought up — never one another session (or a person)
    started, so concurrent test sessions on one machine do not pull it from under each other."""
    mark = TEST_CLUSTER_DIR / STARTED_MARK
    try:
        owner = mark.read_text().strip()
    except OSError:
        return
    if not owner or owner != os.environ.get(SESSION_ENV):
        return
    env = {**os.environ, "LCAB_SLURM_DIR": str(TEST_CLUSTER_DIR)}
    subprocess.run(["bash", str(UP_SCRIPT), "down"], env=env, capture_output=True, timeout=300)
