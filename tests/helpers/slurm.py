"""Where the slurm tier's own test cluster lives, and how the session's end knows to stop it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UP_SCRIPT = ROOT / "launchers" / "slurm_local.sh"
TEST_CLUSTER_DIR = Path(os.environ.get("LCAB_SLURM_TEST_DIR", "/tmp/lcab-slurm-tests"))
STARTED_MARK = ".started-by-pytest"


def stop_test_cluster() -> None:
    """Take down the cluster the tier brought up (never one that was already running)."""
    if not (TEST_CLUSTER_DIR / STARTED_MARK).exists():
        return
    env = {**os.environ, "LCAB_SLURM_DIR": str(TEST_CLUSTER_DIR)}
    subprocess.run(["bash", str(UP_SCRIPT), "down"], env=env, capture_output=True, timeout=300)
