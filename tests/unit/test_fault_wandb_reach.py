"""Asking the W&B server once: any HTTP answer counts, silence and refusal do not, notes expire.

Real loopback servers: one that answers HTTP (404 to everything, as a W&B server does for an
unknown path), one that accepts and never answers, and a port nothing listens on.
"""

from __future__ import annotations

import http.server
import os
import threading
import time

import pytest

from lcab.launch.slurm_launcher import ask_wandb_once
from lcab.records import wandb_reach
from lcab.records.wandb_reach import (
    UNREACHABLE_FILE,
    known_unreachable,
    note_unreachable,
    online_blocker,
    probe,
)
from tests.app.test_fault_wandb import FAKE_KEY, SilentServer, refused_url


@pytest.fixture(autouse=True)
def _fresh_process_memory(monkeypatch):
    monkeypatch.setattr(wandb_reach, "_KNOWN", {})


@pytest.fixture
def answering_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_answers_even_404_is_reachable(answering_url):
    assert probe(answering_url, 5) is None


def test_a_silent_server_is_unreachable_after_the_timeout_and_a_refusal_at_once():
    server = SilentServer()
    try:
        why = probe(f"http://127.0.0.1:{server.port}", 1.0)
    finally:
        server.close()
    assert why is not None and "did not answer within 1 s" in why  # the time-out, not an error
    assert len(server.accepted) == 1  # connected, then waited for an answer that never came
    refused = probe(refused_url(), 5)
    assert refused is not None and "refused" in refused.lower()


def test_a_note_counts_for_this_sweep_invocation_only(tmp_path):
    url = refused_url()
    (tmp_path / "multirun.yaml").write_text("{}")
    note_unreachable(url, "silent", tmp_path)
    wandb_reach._KNOWN.clear()  # another process of the same sweep reads the note
    assert known_unreachable(url, tmp_path) == "silent"
    assert known_unreachable("http://elsewhere:1", tmp_path) is None  # another server
    later = time.time() + 5
    os.utime(tmp_path / "multirun.yaml", (later, later))  # the sweep was started again
    assert known_unreachable(url, tmp_path) is None
    assert online_blocker(url, 5, tmp_path) != (None, False)  # asked again, and noted again


def test_the_slurm_launcher_asks_once_and_notes_it_for_the_jobs(compose, tmp_path, monkeypatch):
    url = refused_url()
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    cfg = compose(["launcher=slurm", "logger=wandb", "logger.mode=online"], hydra=True)
    ask_wandb_once(cfg, tmp_path)
    assert url in (tmp_path / UNREACHABLE_FILE).read_text()
    wandb_reach._KNOWN.clear()
    assert known_unreachable(url, tmp_path) is not None  # what each job reads


def test_the_slurm_launcher_asks_nothing_for_an_offline_logger(compose, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", refused_url())
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose(["launcher=slurm", "logger=wandb"], hydra=True)
    ask_wandb_once(cfg, tmp_path)
    assert not (tmp_path / UNREACHABLE_FILE).exists()
