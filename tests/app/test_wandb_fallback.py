"""W&B never costs a record: an online W&B that cannot start falls back to offline, in bounded time.

Both runs are real CLI sweeps with ``logger=wandb logger.mode=online`` on a machine without W&B
access: once with no API key, once with a well-formed fake key and an unreachable server.
Every W&B folder (data, cache, config, home) points into the test's temp folder.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import run_lcab, wandb_env

pytestmark = pytest.mark.slow

FAKE_KEY = "lcabfake" + "0123456789abcdef" * 2  # 40 characters, as W&B keys are


def sweep_with_online_wandb(
    tmp_path: Path, **extra_env: str
) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = run_lcab(
        "-m",
        "kernel=ranges,sparse",
        "mask=causal",
        "logger=wandb",
        "logger.mode=online",
        "logger.init_timeout_s=10",
        "debug=default",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        env=wandb_env(tmp_path, **extra_env),
    )
    return done, time.monotonic() - start


def check_records_complete(sweep: Path) -> None:
    merged = [json.loads(line) for line in (sweep / "records.jsonl").read_text().splitlines()]
    assert len(merged) == 4 and all(r["status"] == "ok" for r in merged)
    assert (sweep / "records.csv").exists()
    for job in sweep.glob("*/.hydra"):
        assert list(job.parent.glob("wandb/offline-run-*")), "the job logged offline instead"


def test_online_without_a_key_falls_back_to_offline_at_once(tmp_path):
    done, _ = sweep_with_online_wandb(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("W&B online unavailable (no API key") == 2  # one line per job
    assert "wandb sync" in done.stderr
    check_records_complete(tmp_path / "sweep")


def test_a_fake_key_and_no_server_fall_back_within_the_init_timeout(tmp_path):
    done, seconds = sweep_with_online_wandb(
        tmp_path, WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL="http://127.0.0.1:9"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("W&B online unavailable (") == 2
    check_records_complete(tmp_path / "sweep")
    # two jobs, each at most init_timeout_s (10 s) plus W&B's start-up, not its 90 s default
    assert seconds < 2 * 60
    leaked = [
        p
        for p in (tmp_path / "sweep").rglob("*")
        if p.is_file() and FAKE_KEY.encode() in p.read_bytes()
    ]
    assert not leaked, f"the API key was written to {leaked}"


def test_wandb_mode_from_the_environment_is_honoured_when_logger_mode_is_unset(tmp_path):
    run = tmp_path / "run"
    done = run_lcab(
        "logger=wandb",
        "debug=default",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        env=wandb_env(tmp_path, WANDB_MODE="disabled"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(run.glob("wandb/offline-run-*"))  # disabled: W&B wrote no run
    assert len((run / "records.jsonl").read_text().splitlines()) == 2
