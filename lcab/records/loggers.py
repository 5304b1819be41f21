"""Optional record loggers — views of the records, never their keepers.

Only the supervising process (rank 0's side) logs. Records are written to ``records.jsonl``
before a logger sees them, and a logger that cannot start or fails while logging says so in one
line and steps aside (`make_loggers`), so no logger can cost a record. ``wandb`` is imported
only when used (`lcab.records.wandb_run`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Protocol

from omegaconf import DictConfig

from lcab.cell import Cell
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


def make_loggers(cfg: DictConfig, cell: Cell) -> list[RecordLogger]:
    """The loggers selected by ``cfg.logger`` (none, with one line, if W&B cannot start)."""
    if cfg.logger.name == "wandb":
        try:
            from lcab.records.wandb_run import WandbLogger

            return [WandbLogger(cfg, cell)]
        except Exception as err:
            print(f"lcab: W&B could not start ({first_line(err)}); records only", file=sys.stderr)
    return []
