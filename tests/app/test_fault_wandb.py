"""W&B behind a firewall: a server that hangs costs one bounded wait per sweep and loses nothing.

A firewall that drops packets does not refuse a connection, it leaves it hanging. The server
here does exactly that, on loopback: it accepts every connection and never answers (and
counts them). A second one refuses (nothing listens). Each test runs a real two-cell CLI sweep
with ``logger=wandb logger.mode=online`` and a well-formed fake key; every W&B folder points
into the test's temp folder.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import read_jsonl, run_lcab, wandb_env
from tests.helpers.wandb_offline import OfflineRun

pytestmark = pytest.mark.slow

FAKE_KEY = "lcabfake" + "0123456789abcdef" * 2  # 40 characters, as W&B keys are
INIT_TIMEOUT_S = 5


class SilentServer:
    """Accepts TCP connections on loopback and never sends a byte (a dropping firewall)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)  # held open, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def refused_url() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def online_sweep(tmp_path: Path, url: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = run_lcab(
        "-m",
        "kernel=ranges,sparse",
        "mask=causal",
        "logger=wandb",
        "logger.mode=online",
        f"logger.init_timeout_s={INIT_TIMEOUT_S}",
        "debug=default",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        env=wandb_env(tmp_path, WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL=url),
        timeout=900,
    )
    return done, time.monotonic() - start


def check_offline_runs(tmp_path: Path) -> None:
    """Every cell's records are whole, and so is its offline run, which `wandb sync` accepts."""
    sweep = tmp_path / "sweep"
    merged = read_jsonl(sweep / "records.jsonl")
    assert len(merged) == 4 and all(r["status"] == "ok" for r in merged)
    jobs = sorted(p.parent for p in sweep.glob("*/.hydra"))
    assert len(jobs) == 2
    for job in jobs:
        (folder,) = job.glob("wandb/offline-run-*")
        run = OfflineRun.read(next(folder.glob("run-*.wandb")))
        lengths = sorted(r["seqlen"] for r in read_jsonl(job / "records.jsonl"))
        assert sorted(row["seqlen"] for row in run.history) == lengths
        assert run.exit_code == 0 and "lcab-records" in run.artifacts
        sync = subprocess.run(
            [str(Path(sys.executable).with_name("wandb")), "sync", "--dry-run", str(folder)],
            capture_output=True,
            text=True,
            env=wandb_env(tmp_path),
            timeout=120,
        )
        assert sync.returncode == 0, sync.stderr[-2000:]
        assert run.run_id in sync.stdout + sync.stderr  # wandb's own reader found the run


def test_a_hanging_server_is_asked_once_per_sweep_and_every_cell_logs_offline(
    tmp_path, silent_server
):
    url = f"http://127.0.0.1:{silent_server.port}"
    done, _ = online_sweep(tmp_path, url)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "W&B online unavailable (" in line]
    assert len(said) == 2, said  # one line per cell
    assert f"did not answer within {INIT_TIMEOUT_S} s" in said[0]
    assert "known from earlier in this sweep" in said[1]
    assert "could not start" not in done.stderr
    assert len(silent_server.accepted) == 1  # one question for the whole sweep
    check_offline_runs(tmp_path)
    leaked = [
        p
        for p in (tmp_path / "sweep").rglob("*")
        if p.is_file() and FAKE_KEY.encode() in p.read_bytes()
    ]
    assert not leaked, f"the API key was written to {leaked}"


def test_a_refusing_server_is_learned_at_once_and_every_cell_logs_offline(tmp_path):
    done, _ = online_sweep(tmp_path, refused_url())
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "W&B online unavailable (" in line]
    assert len(said) == 2 and "unreachable" in said[0] and "known from earlier" in said[1]
    check_offline_runs(tmp_path)
