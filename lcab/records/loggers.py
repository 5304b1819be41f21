"""Optional record loggers — views of the records, never their keepers.

Only the supervising process (rank 0's side) logs. Records are written to ``records.jsonl``
before a logger sees them, and a logger that cannot start or fails while logging says so in one
line and steps aside (`make_loggers`), so no logger can cost a record. ``wandb`` is imported
only when used (`lcab.records.wandb_run`).
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from lcab.cell import Cell
from lcab.records.logging_base import RecordLogger, first_line, has_credentials

__all__ = ["RecordLogger", "first_line", "has_credentials", "make_loggers"]


def make_loggers(cfg: DictConfig, cell: Cell) -> list[RecordLogger]:
    """The loggers selected by ``cfg.logger`` (none, with one line, if W&B cannot start)."""
    if cfg.logger.name == "wandb":
        try:
            from lcab.records.wandb_run import WandbLogger

            return [WandbLogger(cfg, cell)]
        except Exception as err:
            print(f"lcab: W&B could not start ({first_line(err)}); records only", file=sys.stderr)
    return []
