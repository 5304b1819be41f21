"""Running the real CLI from tests: ``python -m lcab.main`` in a subprocess, as a user would.

One torch thread per run (CI has 2 cores) and this checkout first on ``PYTHONPATH``; W&B tests
also point every W&B folder (data, cache, config, home) into the test's temp folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment for a CLI run, plus ``extra``.

    The checkout goes first on ``PYTHONPATH``, ahead of what the caller had there (a GPU machine
    with no package index has lcab's requirements on it: dropping it lost Hydra on an H100).
    """
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def wandb_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A CLI environment with no W&B settings of the caller's and W&B's folders in ``tmp_path``."""
    env = {k: v for k, v in cli_env().items() if not k.startswith("WANDB_") and k != "NETRC"}
    return {
        **env,
        "HOME": str(tmp_path / "home"),
        # lcab's own caches (--help's) stay the caller's under a new HOME
        "LCAB_CACHE_DIR": os.environ.get("LCAB_CACHE_DIR", str(Path.home() / ".cache" / "lcab")),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        **extra,
    }


def run_with_stacks(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` that, when ``timeout`` passes, ends a Python child with SIGABRT so that
    ``faulthandler`` prints every thread's stack, and fails with that output.

    A CI run once found a dry run that never returned, and it did not come back in dozens of
    runs here: a hang that comes back says where it waits.
    """
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its forked children too can be ended (they hold the pipes)
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # what it forked keeps the pipes open
        out, err = process.communicate()
        raise AssertionError(
            f"{' '.join(argv)} did not end within {timeout:.0f} s; its threads' stacks "
            f"(SIGABRT, faulthandler):\n{err[-12000:]}\nstdout tail:\n{out[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def run_lcab(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m lcab.main *args`` to completion, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "lcab.main", *args],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_lcab(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``python -m lcab.main *args`` in the background (stdout and stderr together)."""
    return subprocess.Popen(
        [sys.executable, "-m", "lcab.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a ``records.jsonl`` file, as dicts."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
