"""What every record logger is, and what a logger needs to start: the ground of `loggers`.

`lcab.records.loggers` picks the loggers of a job and `lcab.records.wandb_run` is one of them;
both read these, so neither imports the other back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from lcab.records.schema import RunRecord


class RecordLogger(Protocol):
    """Receives every record of a job, then ``close``."""

    def log(self, record: RunRecord) -> None:
        """Log one record."""

    def close(self, failed: bool = False) -> None:
        """Finish (always called; ``failed`` when the job is being killed or crashed)."""


def first_line(err: BaseException) -> str:
    """``Type: first line of the message``, short enough for one console line."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


def has_credentials() -> bool:
    """Whether an online W&B start can authenticate at all (key in env or ``~/.netrc``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return host.split(":")[0] in netrc.read_text()
    except OSError:
        return False
