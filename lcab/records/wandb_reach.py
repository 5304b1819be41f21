"""Whether the W&B server answers — asked once per sweep, in bounded time.

Behind a firewall that drops packets, ``wandb.init(mode="online")`` hangs out its time-out and
keeps the run id held (an offline start with it fails). So lcab asks the server first (one HTTP
request bounded by ``logger.init_timeout_s``) and logs offline at once when nothing answers. A
silent server is noted in the sweep folder (``wandb-unreachable.json``) and the process; a note
counts only if newer than the sweep's ``multirun.yaml``, so a later ``resume=true`` asks again.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_URL = "https://api.wandb.ai"
UNREACHABLE_FILE = "wandb-unreachable.json"
"""Sweep-folder note: the W&B server that did not answer, and how it failed."""
_SWEEP_START_FILE = "multirun.yaml"
_KNOWN: dict[str, str] = {}
"""Servers this process found silent: URL -> why (a local sweep's later jobs skip them)."""


def server_url() -> str:
    """The W&B server an online start would talk to (``$WANDB_BASE_URL``, else W&B's cloud)."""
    return os.environ.get("WANDB_BASE_URL") or DEFAULT_URL


def probe(url: str, timeout_s: float) -> str | None:
    """None when ``url`` answers HTTP within ``timeout_s`` (any status), else why not."""
    request = urllib.request.Request(url.rstrip("/") + "/healthz", method="GET")
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None  # an answer, even 404 or 401: the server is there
    except TimeoutError:
        return f"{url} did not answer within {timeout_s:g} s"
    except (urllib.error.URLError, OSError) as err:
        cause = getattr(err, "reason", err)
        if isinstance(cause, TimeoutError):
            return f"{url} did not answer within {timeout_s:g} s"
        spent = time.monotonic() - start
        return f"{url} unreachable after {spent:.1f} s: {cause}"


def known_unreachable(url: str, sweep_dir: Path | None) -> str | None:
    """Why ``url`` is known silent in this process or this sweep invocation, else None."""
    if url in _KNOWN:
        return _KNOWN[url]
    if sweep_dir is None:
        return None
    note, start = sweep_dir / UNREACHABLE_FILE, sweep_dir / _SWEEP_START_FILE
    try:
        if start.exists() and note.stat().st_mtime < start.stat().st_mtime:
            return None  # written by an earlier invocation of this sweep
        data = json.loads(note.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("url") != url:
        return None
    return str(data.get("reason", "unreachable"))


def note_unreachable(url: str, reason: str, sweep_dir: Path | None) -> None:
    """Remember that ``url`` is silent, in this process and (best effort) in the sweep."""
    _KNOWN[url] = reason
    if sweep_dir is not None:
        with contextlib.suppress(OSError):
            (sweep_dir / UNREACHABLE_FILE).write_text(json.dumps({"url": url, "reason": reason}))


def forget_unreachable(sweep_dir: Path) -> None:
    """The server answered: drop an old note (the SLURM launcher, before submitting)."""
    (sweep_dir / UNREACHABLE_FILE).unlink(missing_ok=True)


def online_blocker(url: str, timeout_s: float, sweep_dir: Path | None) -> tuple[str | None, bool]:
    """(why an online start would fail, whether that was known before), or (None, False).

    Asks the server only when neither this process nor the sweep knows it silent.
    """
    known = known_unreachable(url, sweep_dir)
    if known is not None:
        return known, True
    why = probe(url, timeout_s)
    if why is not None:
        note_unreachable(url, why, sweep_dir)
    return why, False
