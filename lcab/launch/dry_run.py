"""``dry_run=true``: what a run or sweep would ask for, and its cost, with nothing submitted.

Every job is composed and resolved as the real run would (so a dry run also validates), then
printed with its shape — SLURM nodes x tasks, GPUs, time limit and partition under
``launcher=slurm``; local processes otherwise — and the total in GPU-hours, an upper bound
taken from the time limits (on CPU, core-hours instead).

Beside the bound, the planner's expectation of each job (`Expect`, given by the entry point,
which sits above the planner's layer): predicted per-GPU TFLOP/s and time per pass at each
length, and the GPU-hours the protocol's repetitions take at those times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from lcab.cell import Cell, few_tokens_warning, tokens_per_rank
from lcab.config import resolve_cell
from lcab.config.fork_map import fork_map, usable_cores
from lcab.config.preflight import composed_jobs
from lcab.launch.checks import uses_slurm
from lcab.launch.shape import JobShape, SlurmSettings, job_shape
from lcab.launch.slurm_launcher import composed_settings

Expect = Callable[[DictConfig, Cell], Any]
"""The planner's expectation of one job: an object with ``hardware``, ``gpu_hours`` and
``lengths`` (each with ``text()``) — `lcab.plan.expected.expect_configured_job`."""


@dataclass(frozen=True)
class JobRow:
    """One job of the dry run."""

    job: str
    launcher: str
    shape: JobShape
    lengths: int
    problem: str
    startup_s: float
    """The launcher's start-up allowance (compilation, NCCL) per job."""
    expectation: Any = None
    """The planner's `Expect` result (None: not asked for)."""
    tokens_per_rank: tuple[tuple[int, int], ...] = ()
    """(length, tokens each rank holds) of a context-parallel job (empty: one device)."""
    warning: str = ""
    """Why the job's lengths measure little on its ranks (`lcab.cell.few_tokens_warning`)."""


def plan_rows(overrides: list[str], multirun: bool, expect: Expect | None = None) -> list[JobRow]:
    """Every job: overrides, launcher, shape, lengths, problem, and the planner's expectation.

    The problem is the one the job will run: under a launcher preset that gives each rank a
    GPU, ``problem.device=auto`` is CUDA even on a login node without one (`job_device`).
    """
    jobs = [(job, cfg, resolve_cell(cfg)) for job, cfg in composed_jobs(overrides, multirun)]
    expectations = (
        _expectations(expect, [(cfg, cell) for _, cfg, cell in jobs])
        if expect is not None
        else [None] * len(jobs)
    )
    rows = []
    for (job, cfg, cell), expectation in zip(jobs, expectations, strict=True):
        if uses_slurm(cfg):
            launcher, settings = "slurm", composed_settings(cfg)
        else:
            gpus = 1 if cell.device == "cuda" else 0
            launcher, settings = "local", SlurmSettings(gpus_per_task=gpus, startup_s=0.0)
        problem = (
            f"{cell.device} {cell.dtype}, heads {cell.heads_q}:{cell.heads_kv}x{cell.head_dim}"
        )
        world = cell.world_size if cell.cp != "none" else 1
        per_rank = tuple((s, tokens_per_rank(s, world)) for s in cell.seqlens) if world > 1 else ()
        rows.append(
            JobRow(
                " ".join(job) or "(defaults)",
                launcher,
                job_shape(cell, settings),
                len(cell.seqlens),
                problem,
                settings.startup_s,
                expectation,
                per_rank,
                few_tokens_warning(cell.seqlens, world, cell.device),
            )
        )
    return rows


_JOBS: tuple[Expect, list[tuple[DictConfig, Cell]]] | None = None
"""What forked workers predict (`_expectations`): inherited, so nothing is pickled to them."""


def _expect_one(index: int) -> Any:
    """The expectation of job ``index`` in a worker (None where it raised: see the caller)."""
    assert _JOBS is not None
    expect, jobs = _JOBS
    try:
        return expect(*jobs[index])
    except Exception:  # re-raised by the parent, in its own process
        return None


def _expectations(expect: Expect, jobs: list[tuple[DictConfig, Cell]]) -> list[Any]:
    """The planner's expectation of every job, the jobs side by side on the machine's cores.

    The planner is CPU-bound and jobs are independent: forked workers (which inherit every
    module and the jobs) predict their share (`lcab.config.fork_map`: a worker that fails, dies
    or hangs is killed and its share predicted here). A job whose prediction raised in a worker
    is predicted again here, so that its error is raised as in a single process. Not a
    `multiprocessing.Pool`: now and then in CI its exit (terminate, then join a worker) waited
    for ever (a dry run of the README's CP sweep; the stack came from `tests/helpers/cli.py`),
    its forked workers stuck in a futex; fork_map bounds every wait and kills what is late.
    """
    global _JOBS
    workers = min(len(jobs), usable_cores())
    if workers < 2:
        return [expect(cfg, cell) for cfg, cell in jobs]
    _JOBS = (expect, jobs)
    try:
        done = fork_map(_expect_one, list(range(len(jobs))), workers)
    finally:
        _JOBS = None
    return [
        result if result is not None else expect(cfg, cell)
        for result, (cfg, cell) in zip(done, jobs, strict=True)
    ]


def print_plan(overrides: list[str], multirun: bool, expect: Expect | None = None) -> int:
    """Print every job's shape, expectation and the sweep's cost; submits and runs nothing."""
    rows = plan_rows(overrides, multirun, expect)
    table = Table(title=f"dry run: {len(rows)} job(s), nothing submitted")
    columns = ["#", "job", "launcher", "shape", "problem", "lengths", "tokens per rank", "GPU-h ≤"]
    if expect is not None:
        columns += ["predicted per GPU (each length)", "GPU-h expected"]
    for column in columns:
        table.add_column(column)
    gpu_hours = core_hours = expected = startup = 0.0
    profiles = set()
    for i, row in enumerate(rows):
        shape, expectation = row.shape, row.expectation
        gpu_hours += shape.gpu_hours()
        core_hours += shape.tasks * shape.cpus_per_task * shape.timeout_min / 60
        text = (
            shape.describe()
            if row.launcher == "slurm"
            else (
                f"{shape.tasks} local process(es), {shape.gpus} GPU(s), "
                f"up to {shape.timeout_min} min (bench.timeout_s x lengths)"
            )
        )
        cells = [str(i), row.job, row.launcher, text, row.problem, str(row.lengths)]
        cells.append("\n".join(f"{s:,}: {n:,}" for s, n in row.tokens_per_rank) or "-")
        cells.append(f"{shape.gpu_hours():.2f}")
        if expectation is not None:
            expected += expectation.gpu_hours
            startup += shape.gpus * row.startup_s / 3600
            profiles.add(expectation.hardware)
            cells.append("\n".join(length.text() for length in expectation.lengths))
            cells.append(f"{expectation.gpu_hours:.3g}")
        table.add_row(*cells)
    Console(width=240).print(table)
    for i, row in enumerate(rows):
        if row.warning:
            print(f"warning: job {i} ({row.job}): {row.warning}")
    print(
        f"total: {len(rows)} job(s), at most {gpu_hours:.1f} GPU-hours "
        f"({core_hours:.1f} CPU core-hours) from the time limits"
    )
    if expect is not None:
        print(
            f"expected: {expected:.3g} GPU-hours of measurement at the planner's predicted "
            f"times (hardware {', '.join(sorted(profiles))}; hardware=NAME picks another "
            f"profile), plus start-up: up to {startup:.3g} GPU-hours by the launchers' startup_s"
        )
    return 0
