"""``python -m lcab.main``: the benchmark app (Hydra).

One job = one cell (kernel x cp x mask x topology) over the configured sequence lengths. The
job validates, runs the cell in supervised worker processes, writes one record per length to
``<job dir>/records.jsonl`` (and W&B if configured) and prints a table. Multiruns (``-m``) are
pre-checked as a whole before the first job starts; bad input exits with code 2.
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

import hydra
from omegaconf import DictConfig

from lcab.config import CONF_DIR, ConfigError, job_info
from lcab.records.sinks import RECORDS_FILE, JsonlSink, RecordWriteError

if TYPE_CHECKING:  # torch and the bench stack load in the functions that run a cell
    from lcab.cell import Cell, JobInfo
    from lcab.records.schema import RunRecord


_STARTED: list[tuple[str, Path]] = []
"""The Hydra key of the run's folder and the folder, once a job started (what Ctrl-C says)."""


def _job_info() -> JobInfo:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    _STARTED[:] = [
        ("hydra.sweep.dir", Path(hc.sweep.dir)) if multirun else ("hydra.run.dir", Path(hc.run.dir))
    ]
    return job_info(cast(DictConfig, hc), multirun=multirun)


def _resume(path: Path, cell: Cell, rewrite: bool = True) -> tuple[list[RunRecord], Cell]:
    """The records this folder settled, and the cell reduced to the other lengths (atomic)."""
    from lcab.records.resume import split_done
    from lcab.records.sinks import set_aside_torn_tail, write_records

    if rewrite:  # a torn last line (a kill mid-write) is kept aside, not dropped
        set_aside_torn_tail(path)
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
    if rank is None and cell.frontier is None:
        from lcab.launch.refusals import strategy_refusal

        refused = strategy_refusal(cell)
        if refused:  # its ranks would only record these words: none is started
            from lcab.bench.environment import environment
            from lcab.bench.results import refused_records

            for record in refused_records(cell, "; ".join(refused), environment(cell.device)):
                write(record)
            return
    if rank is not None and cell.world_size > 1:  # this task is one rank of the cell's world
        from lcab.bench.scheduled import run_as_rank

        run_as_rank(cell, write, *rank)
    elif cell.frontier is not None:  # each probe a fresh world an OOM cannot take down
        from lcab.bench.frontier import run_frontier
        from lcab.bench.supervisor import run_supervised

        run_frontier(cell, write, lambda probe: run_supervised(probe, lambda record: None))
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
    from lcab.bench.scheduled import scheduled_rank, write_job_environment
    from lcab.config import resolve_cell
    from lcab.records.loggers import make_loggers
    from lcab.records.table import record_line

    job = _job_info()
    try:
        cell = resolve_cell(cfg, job)
    except ConfigError as err:
        print(f"lcab: {err}", file=sys.stderr)
        sys.exit(2)
    sink = JsonlSink(Path(job.output_dir) / RECORDS_FILE)
    rank = scheduled_rank()
    if rank is not None and cell.world_size > 1 and cell.frontier is not None:
        from lcab.launch.refusals import FRONTIER_ON_SLURM  # the launcher submits none such

        print(f"lcab: {FRONTIER_ON_SLURM}", file=sys.stderr)
        sys.exit(2)
    if rank is not None and rank[0] == 0:
        write_job_environment(cell)  # for the records the launcher may have to write
    if rank is not None and rank[0] != 0 and cell.world_size > 1:
        # another rank of a scheduled world: compute only (rank 0 records, logs and prints)
        if cfg.resume:
            _, cell = _resume(sink.path, cell, rewrite=False)
        if cell.seqlens:
            _run(cell, lambda record: None, rank)
        return
    records: list[RunRecord] = []
    try:
        if cfg.resume:
            records, cell = _resume(sink.path, cell)
    except RecordWriteError as err:
        _unwritable(err, [], cell.seqlens)
    loggers = make_loggers(cfg, cell)
    from lcab.plan.record_prediction import record_predictor  # the planner, only to run a cell

    predict = record_predictor(cfg, cell)  # every length predicted before any is timed
    log = logging.getLogger("lcab")  # the job's main.log (conf/hydra/job_logging/lcab.yaml)
    log.info(
        "cell kernel=%s cp=%s mask=%s world=%d on %s, lengths %s; records to %s",
        cell.kernel, cell.cp, cell.mask, cell.world_size, cell.device, list(cell.seqlens),
        sink.path,
    )  # fmt: skip

    progress = cell.bench.progress and not sys.stdout.isatty()  # a terminal has the bar
    what = f"{cell.kernel}/{cell.cp}/{cell.mask}"

    def write(record: RunRecord) -> None:
        predict(record)  # never raises: a cell without a prediction says why
        records.append(record)
        sink.write(record)  # first: a record that cannot be kept stops the cell
        log.info("%s", record_line(record))
        for logger in loggers:
            logger.log(record)
        if progress and record.seqlen in cell.seqlens:  # a log or a pipe: a line per length
            done = f"{cell.seqlens.index(record.seqlen) + 1}/{len(cell.seqlens)}"
            print(f"lcab: {what} [{done}] {record_line(record, with_notes=False)}", flush=True)

    failed = True  # until the cell returns: a kill or a crash closes loggers as failed
    lost: RecordWriteError | None = None
    try:
        if cell.seqlens:  # empty when a resumed job had every length settled
            _run(cell, write, rank)
        failed = False
    except RecordWriteError as err:
        lost = err
    finally:
        for logger in loggers:
            logger.close(failed=failed)
    print_records(records, title=job.override_dirname or "lcab results")
    print(f"records: {sink.path}")
    if lost is not None:
        done = {r.seqlen for r in records}
        _unwritable(lost, records[-1:], [s for s in cell.seqlens if s not in done])


def _unwritable(
    err: RecordWriteError, unsaved: list[RunRecord], not_run: Sequence[int]
) -> NoReturn:
    """One line naming the file and the cause, the unsaved record on stdout, exit code 1.

    A full, read-only or vanished output folder ends the job; what was measured but not saved
    goes to stdout as JSON lines.
    """
    where = f"{len(unsaved)} unsaved record(s) follow on stdout as JSON lines; " if unsaved else ""
    print(
        f"lcab: cannot write records: {err.path}: {err.cause}; {where}"
        f"not run: seqlen {list(not_run) or 'none'}; free the folder, then rerun with "
        "resume=true",
        file=sys.stderr,
    )
    for record in unsaved:
        print(record.to_json())
    sys.stdout.flush()
    sys.exit(1)


def _interrupted(argv: list[str]) -> NoReturn:
    """Ctrl-C in one line: what was saved, where, and the command that continues; exit 130.

    ``resume=true`` in the same folder runs only the lengths not settled.
    """
    from lcab.records.sinks import read_records

    if not _STARTED:
        print("lcab: interrupted before a job ran in this process", file=sys.stderr)
        sys.exit(130)
    key, folder = _STARTED[0]
    files = [folder / RECORDS_FILE] if key == "hydra.run.dir" else folder.glob(f"*/{RECORDS_FILE}")
    saved = sum(len(read_records(path)) for path in files if path.exists())
    where = folder / RECORDS_FILE if key == "hydra.run.dir" else f"{folder}/*/{RECORDS_FILE}"
    kept = [a for a in argv if a.partition("=")[0].lstrip("+") not in ("resume", key)]
    command = shlex.join(["python", "-m", "lcab.main", *kept, "resume=true", f"{key}={folder}"])
    print(
        f"lcab: interrupted; {saved} record(s) saved in {where}; continue with: {command}",
        file=sys.stderr,
    )
    sys.exit(130)


def _unwind_on_sigterm() -> None:
    """SIGTERM (``kill``, a scheduler's time limit) unwinds like Ctrl-C instead of vanishing.

    Raising SystemExit runs the ``finally`` blocks: rank processes are killed and joined,
    loggers closed, records kept.
    """

    def unwind(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


def _no_space_in_one_line() -> None:
    """A disk with no room for Hydra's own files ends the run in one line and exit code 1.

    Hydra writes ``.hydra/*.yaml`` before lcab's code runs and reports a failure as a
    traceback; wrapping `Hydra.run` and `Hydra.multirun` (hydra-core 1.3) gives "No space left
    on device" the one-line ending of lcab's own writes (`_unwritable`).
    """
    import errno
    import functools

    from hydra._internal.hydra import Hydra

    def guarded(method: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(method)
        def run(*args: object, **kwargs: object) -> object:
            try:
                return method(*args, **kwargs)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                folder, name = _written_where(err)
                print(
                    f"lcab: cannot write to {folder}: No space left on device{name}; not run "
                    "from here on (records written so far stay; free space, then rerun with "
                    "resume=true)",
                    file=sys.stderr,
                )
                sys.exit(1)

        return run

    for name in ("run", "multirun"):
        method = getattr(Hydra, name)
        if not getattr(method, "_lcab_guarded", False):
            wrapped = guarded(method)
            wrapped._lcab_guarded = True  # type: ignore[attr-defined]
            setattr(Hydra, name, wrapped)


def _written_where(err: OSError) -> tuple[str, str]:
    """The folder Hydra was writing to when ``err`` was raised, and the file's name (if known).

    A failed ``write`` carries no file name: the folder is read from the innermost frame of
    Hydra's writers that holds one (``output_dir``, ``sweep_dir``).
    """
    folder: object = None
    name: object = None
    tb = err.__traceback__
    while tb is not None:
        local = tb.tb_frame.f_locals
        folder = local.get("output_dir", local.get("sweep_dir", folder))
        name = local.get("filename", name)
        tb = tb.tb_next
    if err.filename:
        written = Path(str(err.filename))
        folder, name = written.parent, written.name
    if folder is None:
        return "the output folder", ""
    path = Path(str(folder)).absolute()
    if path.name == ".hydra" and name:
        path, name = path.parent, f".hydra/{name}"
    return str(path), f" (writing {name})" if name else ""


def _dry_run(argv: list[str]) -> bool:
    """Whether the command line says ``dry_run=true``."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "dry_run":
            return value.lower() in ("true", "yes", "1")
    return False


def main() -> None:
    """Pre-check the whole run or sweep (SLURM shapes too), then hand over to Hydra."""
    from lcab.config.help import fast_help_applies, print_help

    argv = sys.argv[1:]
    if fast_help_applies(argv):  # before torch and Hydra's walk over every config group
        sys.exit(print_help("config", argv))
    from lcab.config.choices import choice_problems

    misspelt = choice_problems(argv, CONF_DIR)  # a wrong group option: before torch, too
    if misspelt:
        for line in misspelt:
            print(f"lcab: {line}", file=sys.stderr)
        sys.exit(2)
    from lcab.config import register_configs
    from lcab.config.preflight import output_problem, preflight, split_argv
    from lcab.launch import register_launcher
    from lcab.launch.checks import slurm_problems, submission_problems
    from lcab.records.callback import write_failures

    register_configs()
    register_launcher()
    _unwind_on_sigterm()
    # a sweep is not refused for a cell that cannot be built: that cell is a skipped record
    code = preflight(argv, extra=submission_problems if split_argv(argv)[1] else slurm_problems)
    if code:
        sys.exit(code)
    if _dry_run(argv):
        from lcab.launch.dry_run import print_plan
        from lcab.plan.expected import expect_configured_job

        sys.exit(print_plan(*split_argv(argv), expect=expect_configured_job))
    unwritable = output_problem(argv)
    if unwritable is not None:
        print(f"lcab: {unwritable}; nothing was run", file=sys.stderr)
        sys.exit(1)
    _no_space_in_one_line()
    try:
        app()
    except KeyboardInterrupt:
        _interrupted(argv)
    if write_failures():  # the merged records or the CSV view could not be written
        sys.exit(1)


if __name__ == "__main__":
    main()
