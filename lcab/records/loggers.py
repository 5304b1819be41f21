"""Optional record loggers (views of the records): Weights & Biases.

Only the supervising process (rank 0's side) logs. One W&B run per job (cell): config = the
resolved config, one logged step per record (x = seqlen), the record table at the end, tags =
(kernel, cp, mask), group = the sweep id. ``wandb`` is imported only when used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal, Protocol, cast

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


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


def _has_credentials() -> bool:
    """Whether an online W&B start can authenticate at all (key in env or ``~/.netrc``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return host.split(":")[0] in netrc.read_text()
    except OSError:
        return False


class WandbLogger(RecordLogger):
    """Logs records to a W&B run; W&B trouble never costs a record.

    ``online`` that cannot start (no key, a bad key, no network: bounded by ``init_timeout_s``)
    falls back to ``offline`` with one line saying why and how to upload later; a failure
    while logging disables the logger with one line. Records are written by lcab itself
    before any logger sees them, so nothing W&B does can lose one.
    """

    def __init__(self, cfg: DictConfig, cell: Cell) -> None:
        import wandb

        self._wandb = wandb
        self._rows: list[dict[str, Any]] = []
        self._broken = False
        job_dir = Path(cell.job.output_dir)
        mode = cfg.logger.mode or os.environ.get("WANDB_MODE") or "offline"
        init = {
            "project": cfg.logger.project,
            "entity": cfg.logger.entity,
            "group": cfg.logger.group or cell.job.sweep_id,
            "name": cell.job.override_dirname or cell.job.run_id or None,
            "job_type": "bench",
            "tags": [cell.kernel, cell.cp, cell.mask, *cfg.logger.tags],
            "config": OmegaConf.to_container(cfg, resolve=True),
            "dir": str(job_dir),
            "reinit": "finish_previous",
        }
        self.run: Any = None
        if mode == "online":
            why = None if _has_credentials() else "no API key (set WANDB_API_KEY or `wandb login`)"
            if why is None:
                try:
                    settings = wandb.Settings(init_timeout=float(cfg.logger.init_timeout_s))
                    self.run = wandb.init(mode="online", settings=settings, **init)
                except Exception as err:  # auth, network, time-out: all mean "not now"
                    why = _first_line(err)
            if self.run is None:
                print(
                    f"lcab: W&B online unavailable ({why}); logging offline in {job_dir}/wandb "
                    f"- upload later with: wandb sync {job_dir}/wandb/offline-run-*",
                    file=sys.stderr,
                )
                mode = "offline"
        if self.run is None:
            if mode not in ("offline", "disabled"):
                raise ValueError(f"logger.mode={mode!r} is invalid: online, offline or disabled")
            self.run = wandb.init(mode=cast(Literal["offline", "disabled"], mode), **init)

    @override
    def log(self, record: RunRecord) -> None:
        if self._broken:
            return
        try:
            flat = record.flat()
            metrics = {
                k: v
                for k, v in flat.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None
            }
            metrics["status_ok"] = int(record.status == "ok")
            self.run.log(metrics)
            self._rows.append({k: v for k, v in flat.items() if isinstance(v, (int, float, str))})
        except Exception as err:
            self._give_up(err)

    @override
    def close(self) -> None:
        try:
            if self._rows and not self._broken:
                names = sorted({k for row in self._rows for k in row})
                table = self._wandb.Table(
                    columns=list[str | int](names),
                    data=[[row.get(c) for c in names] for row in self._rows],
                )
                self.run.log({"records": table})
            self.run.finish()
        except Exception as err:
            self._give_up(err)

    def _give_up(self, err: BaseException) -> None:
        if not self._broken:
            print(
                f"lcab: W&B logging stopped ({_first_line(err)}); records unaffected",
                file=sys.stderr,
            )
        self._broken = True


def make_loggers(cfg: DictConfig, cell: Cell) -> list[RecordLogger]:
    """The loggers selected by ``cfg.logger`` (none, with one line, if W&B cannot start)."""
    if cfg.logger.name == "wandb":
        try:
            return [WandbLogger(cfg, cell)]
        except Exception as err:
            print(f"lcab: W&B could not start ({_first_line(err)}); records only", file=sys.stderr)
    return []
