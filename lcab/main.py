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

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from lcab.cell import Cell, JobInfo
from lcab.config import CONF_DIR, ConfigError, register_configs, resolve_cell
from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, JsonlSink

register_configs()


def _job_info() -> JobInfo:
    hc = HydraConfig.get()
    output = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_id = Path(hc.sweep.dir).name if multirun else output.name
    num = hc.job.num if multirun else None
    return JobInfo(
        output_dir=str(output),
        run_id=f"{sweep_id}-{num}" if num is not None else sweep_id,
        sweep_id=sweep_id,
        job_num=num,
        override_dirname=hc.job.override_dirname,
    )


def _resume(path: Path, cell: Cell) -> tuple[list[RunRecord], Cell]:
    """The records this folder already settled, and the cell reduced to the other lengths."""
    from lcab.records.resume import split_done
    from lcab.records.sinks import write_records

    kept, todo = split_done(path, cell.seqlens, cell.config)
    if path.exists():
        write_records(path, kept)  # unfinished records go: their lengths get new ones
    print(
        f"lcab: resume: {len(kept)} settled record(s) kept in {path}; "
        f"running seqlen {todo or 'none'}",
        file=sys.stderr,
    )
    return kept, cell.with_seqlens(todo)


def _run(cell: Cell, write: Callable[[RunRecord], None]) -> None:
    if cell.bench.isolate:
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
    records: list[RunRecord] = []
    if cfg.resume:
        records, cell = _resume(sink.path, cell)
    loggers = make_loggers(cfg, cell)

    def write(record: RunRecord) -> None:
        sink.write(record)
        for logger in loggers:
            logger.log(record)
        records.append(record)

    try:
        if cell.seqlens:  # empty when a resumed job had every length settled
            _run(cell, write)
    finally:
        for logger in loggers:
            logger.close()
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


def main() -> None:
    """Pre-check the whole run or sweep, then hand over to Hydra."""
    from lcab.config.preflight import preflight

    _unwind_on_sigterm()
    code = preflight(sys.argv[1:])
    if code:
        sys.exit(code)
    app()


if __name__ == "__main__":
    main()
