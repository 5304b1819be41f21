"""The ``slurm`` tier: a real SLURM cluster, brought up on this machine when it can host one.

``slurm_cluster`` uses a cluster that is already up (``SLURM_CONF`` set and ``sinfo`` answering);
otherwise, as root, it brings up ``launchers/slurm_local.sh`` (two emulated nodes n1, n2 with
accounting; idempotent, so every pytest-xdist worker may ask) and the session's end takes it
down again (``tests/conftest.py``); otherwise the tier is skipped with the reason. Tests of the
tier take a file lock, so one runs at a time whichever worker holds it: they all watch the
same queue.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.slurm import SESSION_ENV, STARTED_MARK, TEST_CLUSTER_DIR, UP_SCRIPT


def _answers(env: dict[str, str]) -> bool:
    if shutil.which("sinfo") is None:
        return False
    done = subprocess.run(["sinfo", "-h"], env=env, capture_output=True, timeout=30)
    return done.returncode == 0


@pytest.fixture(scope="session")
def _cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    if env.get("SLURM_CONF") and _answers(env):
        return env
    if os.geteuid() != 0:
        pytest.skip("slurm tier: no SLURM cluster answers, and bringing one up needs root")
    env["LCAB_SLURM_DIR"] = str(TEST_CLUSTER_DIR)
    up = subprocess.run(
        ["bash", str(UP_SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=900
    )
    if up.returncode != 0:
        pytest.skip(f"slurm tier: launchers/slurm_local.sh up failed: {up.stderr[-800:]}")
    mark = TEST_CLUSTER_DIR / STARTED_MARK
    if "already up" not in up.stderr and not mark.exists():  # this session started it
        mark.write_text(os.environ.get(SESSION_ENV, ""))
    env["SLURM_CONF"] = str(TEST_CLUSTER_DIR / "slurm.conf")
    return env


@pytest.fixture
def slurm_cluster(_cluster_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The environment for commands that talk to the cluster; one test at a time."""
    lock = Path(f"{TEST_CLUSTER_DIR}.lock")
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield _cluster_env
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
