"""``python -m lcab.main``: the benchmark app (Hydra).

One job = one cell (kernel x cp x mask x topology) over the configured sequence lengths. The
job validates, runs the cell in supervised worker processes, writes one record per length to
``<job dir>/records.jsonl`` (and W&B if configured) and prints a table. Multiruns (``-m``) are
pre-checked as a whole before the first job starts; bad input exits with code 2.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from lcab.bench.scheduled import scheduled_rank
from lcab.cell import Cell, JobInfo
from lcab.config import CONF_DIR, ConfigError, job_info, register_configs, resolve_cell
from lcab.launch import register_launcher
from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, JsonlSink

register_configs()
register_launcher()


def _job_info() -> JobInfo:
    hc = HydraConfig.get()
    return job_info(cast(DictConfig, hc), multirun=hc.mode == RunMode.MULTIRUN)


def _resume(path: Path, cell: Cell, rewrite: bool = True) -> tuple[list[RunRecord], Cell]:
    """The records this folder already settled, and the cell reduced to the other lengths.

    Every rank of a scheduled world reads the same answer: the rewrite is atomic and keeps
    exactly the settled records, so reading before or after it gives the same lengths.
    """
    from lcab.records.resume import split_done
    from lcab.records.sinks import write_records

    kept, todo = split_done(path, cell.seqlens, cell.config)
    if path.exists() and rewrite:
        write_records(path, kept)  # unfinished records go: their lengths get new ones
    print(
        f"lcab: resume: {len(kept)} settled record(s) kept in {path}; "
        f"running seqlen {todo or 'none'}",
        file=sys.stderr,
    )
    return kept, cell.with_seqlens(todo)


def _run(cell: Cell, write: Callable[[RunRecord], None], rank: tuple[int, int] | None) -> None:
    if rank is not None and cell.world_size > 1:  # this task is one rank of the cell's world
        from lcab.bench.scheduled import run_as_rank

        run_as_rank(cell, write, *rank)
    elif cell.bench.isolate:
        from lcab.bench.supervisor import run_supervised

        run_supervised(cell, write)
    else:
        from lcab.bench.worker import run_in_process

        run_in_process(cell, write)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> None:
    """Run one cell and record it (Hydra calls this once per job)."""
    from lcab.bench.console import print_records
    from lcab.records.loggers import make_loggers

    job = _job_info()
    try:
        cell = resolve_cell(cfg, job)
    except ConfigError as err:
        print(f"lcab: {err}", file=sys.stderr)
        sys.exit(2)
    sink = JsonlSink(Path(job.output_dir) / RECORDS_FILE)
    rank = scheduled_rank()
    if rank is not None and rank[0] != 0 and cell.world_size > 1:
        # another rank of a scheduled world: compute only (rank 0 records, logs and prints)
        if cfg.resume:
            _, cell = _resume(sink.path, cell, rewrite=False)
        if cell.seqlens:
            _run(cell, lambda record: None, rank)
        return
    records: list[RunRecord] = []
    if cfg.resume:
        records, cell = _resume(sink.path, cell)
    loggers = make_loggers(cfg, cell)

    def write(record: RunRecord) -> None:
        sink.write(record)
        for logger in loggers:
            logger.log(record)
        records.append(record)

    failed = True  # until the cell returns: a kill or a crash closes loggers as failed
    try:
        if cell.seqlens:  # empty when a resumed job had every length settled
            _run(cell, write, rank)
        failed = False
    finally:
        for logger in loggers:
            logger.close(failed=failed)
    print_records(records, title=f"{job.override_dirname or 'lcab'}  ->  {sink.path}")


def _unwind_on_sigterm() -> None:
    """SIGTERM (``kill``, a scheduler's time limit) unwinds like Ctrl-C instead of vanishing.

    Python's default SIGTERM ends the process on the spot; raising SystemExit instead runs the
    ``finally`` blocks: the cell's rank processes are killed and joined, loggers are closed, and
    every record written so far stays (``resume=true`` picks up from there).
    """

    def unwind(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


def _dry_run(argv: list[str]) -> bool:
    """Whether the command line says ``dry_run=true``."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "dry_run":
            return value.lower() in ("true", "yes", "1")
    return False


def main() -> None:
    """Pre-check the whole run or sweep (SLURM shapes too), then hand over to Hydra."""
    from lcab.config.preflight import preflight, split_argv
    from lcab.launch.checks import slurm_problems

    _unwind_on_sigterm()
    argv = sys.argv[1:]
    code = preflight(argv, extra=slurm_problems)
    if code:
        sys.exit(code)
    if _dry_run(argv):
        from lcab.launch.dry_run import print_plan

        sys.exit(print_plan(*split_argv(argv)))
    app()


if __name__ == "__main__":
    main()
