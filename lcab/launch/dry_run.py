"""``dry_run=true``: what a run or sweep would ask for, and its cost, with nothing submitted.

Every job is composed and resolved as the real run would (so a dry run also validates), then
printed with its shape (SLURM or local), the time limits' bound in GPU-hours (CPU: core-hours)
and the planner's expectation (`Expect`, given by the entry point above the planner's layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig
from rich.table import Table

from lcab.cell import Cell, few_tokens_warning, tokens_per_rank
from lcab.config import resolve_cell
from lcab.config.fork_map import fork_map, usable_cores
from lcab.config.preflight import composed_jobs
from lcab.launch.checks import uses_slurm
from lcab.launch.refusals import frontier_problems, job_refusal
from lcab.launch.shape import JobShape, SlurmSettings, job_shape
from lcab.launch.slurm_launcher import composed_settings
from lcab.records.table import console

Expect = Callable[[DictConfig, Cell], Any]
"""The planner's expectation of one job (`lcab.plan.expected.expect_configured_job`)."""


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
    refused: tuple[str, ...] = ()
    """Why the job would end ``skipped`` (`lcab.launch.refusals`) or its schedule is wrong; such
    a job is priced at zero and counted apart."""
    device: str = "cpu"
    schedule: str = ""
    """What the schedule check of a context-parallel job saw (`lcab.cp.schedule_check`)."""

    @property
    def gpu_hours(self) -> float:
        """The time limits' bound on its GPU-hours; nothing for a job that would be skipped."""
        return 0.0 if self.refused else self.shape.gpu_hours()


def plan_rows(overrides: list[str], multirun: bool, expect: Expect | None = None) -> list[JobRow]:
    """Every job: overrides, launcher, shape, lengths, problem, and the planner's expectation."""
    jobs = [(job, cfg, resolve_cell(cfg)) for job, cfg in composed_jobs(overrides, multirun)]
    refusals, predicted, schedules = _checks(expect, [(cfg, cell) for _, cfg, cell in jobs])
    expectations = [None if why else value for why, value in zip(refusals, predicted, strict=True)]
    rows = []
    for (job, cfg, cell), expectation, refused, (schedule, wrong) in zip(
        jobs, expectations, refusals, schedules, strict=True
    ):
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
        shown = [o for o in job if o.split("=", 1)[0].lstrip("+") != "dry_run"]
        rows.append(
            JobRow(
                " ".join(shown) or "(defaults)",
                launcher,
                job_shape(cell, settings),
                len(cell.seqlens),
                problem,
                settings.startup_s,
                expectation,
                per_rank,
                few_tokens_warning(cell.seqlens, world, cell.device),
                refused or wrong,
                cell.device,
                schedule,
            )
        )
    return rows


_JOBS: tuple[Expect | None, list[tuple[DictConfig, Cell]]] | None = None
"""What forked workers check and predict (`_checks`): inherited, so nothing is pickled to them."""
_FAILED = object()
"""A worker's answer for a task that raised (the parent runs it again, to raise it there)."""


def _task(kind: str, index: int) -> Any:
    """Job ``index``'s refusal (``refuse``) or the planner's expectation (``expect``)."""
    assert _JOBS is not None
    expect, jobs = _JOBS
    cfg, cell = jobs[index]
    if kind == "refuse":
        slurm = frontier_problems(cell) if uses_slurm(cfg) else []
        return tuple(slurm + job_refusal(cell))
    if kind == "schedule":
        return _schedule(cell)
    return expect(cfg, cell) if expect is not None else None


def _schedule(cell: Cell) -> tuple[str, tuple[str, ...]]:
    """(what the schedule check saw, its refusal) of a CP job (`lcab.cp.schedule_check`)."""
    if cell.cp == "none":
        return "", ()
    from lcab.cp.schedule_check import check_job

    report = check_job(cell)
    if isinstance(report, str):
        return report, ()
    problems = tuple(f"schedule check: {p}" for p in report.problems[:3])
    return report.text(), problems


def _task_in_worker(task: tuple[str, int]) -> Any:
    try:
        return _task(*task)
    except Exception:  # re-raised by the parent, in its own process
        return _FAILED


def _checks(
    expect: Expect | None, jobs: list[tuple[DictConfig, Cell]]
) -> tuple[list[tuple[str, ...]], list[Any], list[tuple[str, tuple[str, ...]]]]:
    """Every job's refusal, schedule check and the planner's expectation, on every core.

    All are CPU-bound and independent, so they run in forked workers (`lcab.config.fork_map`,
    which bounds every wait, unlike a `multiprocessing.Pool` whose exit hung in CI); a task
    that raised in a worker runs again here, to raise as in a single process.
    """
    global _JOBS
    # the schedule check (the longest) second, so a round-robin of two gives it a worker alone
    kinds = ("refuse", "schedule", "expect") if expect is not None else ("refuse", "schedule")
    tasks = [(kind, i) for i in range(len(jobs)) for kind in kinds]
    _JOBS = (expect, jobs)
    try:
        answers = dict(zip(tasks, fork_map(_task_in_worker, tasks, usable_cores()), strict=True))

        def answer(kind: str, i: int) -> Any:
            return _task(kind, i) if answers[kind, i] is _FAILED else answers[kind, i]

        refusals = [answer("refuse", i) for i in range(len(jobs))]
        schedules = [answer("schedule", i) for i in range(len(jobs))]
        expectations = [  # a refused job's expectation is not shown
            None if refusals[i] or expect is None else answer("expect", i) for i in range(len(jobs))
        ]
    finally:
        _JOBS = None
    return refusals, expectations, schedules


def print_plan(overrides: list[str], multirun: bool, expect: Expect | None = None) -> int:
    """Print every job's shape, expectation and the sweep's cost; submits and runs nothing.

    In the machine's units (GPU: TFLOP/s, GPU-hours; CPU: GFLOP/s, wall and core-hours). The
    table fits 120 columns: a shared problem is said once above it, long texts (refusals,
    warnings, rate notes) are numbered notes under it; skipped jobs cost nothing.
    """
    rows = plan_rows(overrides, multirun, expect)
    on_cpu = all(row.device == "cpu" for row in rows)
    unit = "GFLOP/s" if on_cpu else "TFLOP/s per GPU"
    problems = {row.problem for row in rows}
    table = Table(title=f"dry run: {len(rows)} job(s), nothing submitted")
    columns = ["#", "job", "shape"] + (["problem"] if len(problems) > 1 else [])
    if expect is not None:
        columns.append(f"predicted fwd / bwd {unit} (time)")
    columns += ["hours ≤", "expected"] if expect is not None else ["hours ≤"]
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in ("hours ≤", "expected") else "left",
            no_wrap=column.startswith("predicted"),
            overflow="fold",  # a cut override ("mask=causal_docum…") says nothing
        )
    notes: list[str] = []
    limit_hours = core_hours = expected = startup = 0.0
    profiles = set()
    for i, row in enumerate(rows):
        shape, expectation = row.shape, row.expectation
        job_hours = shape.timeout_min / 60 if on_cpu else row.gpu_hours
        if not row.refused:
            limit_hours += job_hours
            core_hours += shape.tasks * shape.cpus_per_task * shape.timeout_min / 60
        cells = [str(i), row.job, _shape_text(row)] + ([row.problem] if len(problems) > 1 else [])
        if row.warning:
            notes.append(f"job {i}: {row.warning}")
            cells[1] += f" [{len(notes)}]"
        rate_note = getattr(expectation, "rate_note", None)
        if rate_note and not row.refused:  # one note per kernel, marked on each of its jobs
            if rate_note not in notes:
                notes.append(rate_note)
            cells[1] += f" [{notes.index(rate_note) + 1}]"
        search_note = getattr(expectation, "search_note", None)
        if search_note and not row.refused:
            notes.append(f"job {i}: {search_note}")
            cells[1] += f" [{len(notes)}]"
        if row.refused:
            notes.append(f"job {i} would end skipped: {'; '.join(row.refused)}")
            if expect is not None:
                cells.append(f"skipped, costs nothing [{len(notes)}]")
            cells += ["0", "0"] if expect is not None else ["0"]
        else:
            hours = 0.0
            if expectation is not None:
                scale = 1e3 if on_cpu else 1.0
                lines = [_length(length, scale, row) for length in expectation.lengths]
                cells.append("\n".join(lines))
                wall = sum(length.wall_s for length in expectation.lengths) / 3600
                hours = wall if on_cpu else expectation.gpu_hours
                expected += hours
                startup += shape.gpus * row.startup_s / 3600
                profiles.add(expectation.hardware)
            cells.append(f"{job_hours:.2f}")
            if expectation is not None:
                cells.append(f"{hours:.3g}")
        table.add_row(*cells)
    out = console()
    if len(problems) == 1:
        out.print(f"problem of every job: {problems.pop()}", markup=False, highlight=False)
    out.print(table)
    for number, note in enumerate(notes, 1):
        out.print(f"[{number}] {note}", markup=False, highlight=False)
    refused = sum(bool(row.refused) for row in rows)
    apart = f" ({refused} would end skipped and cost nothing)" if refused else ""
    bound = f"{limit_hours:.1f} h of wall time" if on_cpu else f"{limit_hours:.1f} GPU-hours"
    print(
        f"total: {len(rows)} job(s){apart}, at most {bound} ({core_hours:.1f} CPU "
        "core-hours) from the time limits"
    )
    checked = [f"  job {i}: {row.schedule}" for i, row in enumerate(rows) if row.schedule]
    if checked:
        print("schedules (every rank's own code at the job's world size, nothing sent):")
        print("\n".join(checked))
    if expect is not None:
        what = _wall(expected * 3600) if on_cpu else f"{expected:.3g} GPU-hours"
        line = (
            f"expected: {what} of measurement at the planner's predicted times "
            f"(hardware {', '.join(sorted(profiles)) or 'none'}; hardware=NAME picks another "
            "profile)"
        )
        if not on_cpu:
            line += f", plus start-up: up to {startup:.3g} GPU-hours by the launchers' startup_s"
        print(line)
    return 0


def _shape_text(row: JobRow) -> str:
    """The job's shape in a few words (SLURM's full request: `JobShape.describe`)."""
    shape = row.shape
    if row.launcher == "slurm":
        return shape.describe()
    gpus = f", {shape.gpus} GPU" if shape.gpus else ""
    return f"{shape.tasks} local process(es){gpus}, up to {shape.timeout_min} min"


def _wall(seconds: float) -> str:
    """A wall time for people: ``42 s``, ``3.5 min``, ``1.2 h``."""
    if seconds < 60:
        return f"{seconds:.2g} s of wall time"
    if seconds < 3600:
        return f"{seconds / 60:.2g} min of wall time"
    return f"{seconds / 3600:.2g} h of wall time"


def _length(length: Any, scale: float, row: JobRow) -> str:
    """One length's prediction, with the tokens each rank holds under CP."""
    per_rank = dict(row.tokens_per_rank)
    text = length.text(scale)
    if length.seqlen in per_rank:
        head, _, rest = text.partition(":")
        text = f"{head} ({per_rank[length.seqlen]:,}/rank):{rest}"
    return text
