"""Optional record loggers (views of the records): Weights & Biases.

Only the supervising process (rank 0's side) logs. One W&B run per job (cell): config = the
resolved config, one logged step per record (x = seqlen), the record table at the end, tags =
(kernel, cp, mask), group = the sweep id. ``wandb`` is imported only when used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf
from typing_extensions import override

from lcab.cell import Cell
from lcab.records.schema import RunRecord


class RecordLogger(Protocol):
    """Receives every record of a job, then ``close``."""

    def log(self, record: RunRecord) -> None:
        """Log one record."""

    def close(self) -> None:
        """Finish (always called, also after failures)."""


class WandbLogger(RecordLogger):
    """Logs records to a W&B run (offline by default)."""

    def __init__(self, cfg: DictConfig, cell: Cell) -> None:
        import wandb

        self._wandb = wandb
        self._rows: list[dict[str, Any]] = []
        job_dir = Path(cell.job.output_dir)
        os.environ.setdefault("WANDB_DIR", str(job_dir))
        self.run = wandb.init(
            project=cfg.logger.project,
            entity=cfg.logger.entity,
            mode=cfg.logger.mode,
            group=cfg.logger.group or cell.job.sweep_id,
            name=cell.job.override_dirname or cell.job.run_id or None,
            job_type="bench",
            tags=[cell.kernel, cell.cp, cell.mask, *cfg.logger.tags],
            config=OmegaConf.to_container(cfg, resolve=True),  # type: ignore[arg-type]
            dir=str(job_dir),
            reinit=True,
        )

    @override
    def log(self, record: RunRecord) -> None:
        flat = record.flat()
        metrics = {
            k: v
            for k, v in flat.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None
        }
        metrics["status_ok"] = int(record.status == "ok")
        self.run.log(metrics)
        self._rows.append({k: v for k, v in flat.items() if isinstance(v, (int, float, str))})

    @override
    def close(self) -> None:
        if self._rows:
            names = sorted({k for row in self._rows for k in row})
            table = self._wandb.Table(
                columns=list[str | int](names),
                data=[[row.get(c) for c in names] for row in self._rows],
            )
            self.run.log({"records": table})
        self.run.finish()


def make_loggers(cfg: DictConfig, cell: Cell) -> list[RecordLogger]:
    """The loggers selected by ``cfg.logger``."""
    if cfg.logger.name == "wandb":
        return [WandbLogger(cfg, cell)]
    return []
