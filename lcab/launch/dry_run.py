"""``dry_run=true``: what a run or sweep would ask for, and its cost, with nothing submitted.

Every job is composed and resolved as the real run would (so a dry run also validates), then
printed with its shape — SLURM nodes x tasks, GPUs, time limit and partition under
``launcher=slurm``; local processes otherwise — and the total in GPU-hours, an upper bound
taken from the time limits (on CPU, core-hours instead).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from lcab.config import resolve_cell
from lcab.config.preflight import composed_jobs
from lcab.launch.checks import uses_slurm
from lcab.launch.shape import JobShape, SlurmSettings, job_shape
from lcab.launch.slurm_launcher import composed_settings


def plan_rows(overrides: list[str], multirun: bool) -> list[tuple[str, str, JobShape, int, str]]:
    """(job overrides, launcher, shape, lengths, problem) of every job.

    The problem is the one the job will run: under a launcher preset that gives each rank a
    GPU, ``problem.device=auto`` is CUDA even on a login node without one (`job_device`).
    """
    rows = []
    for job, cfg in composed_jobs(overrides, multirun):
        cell = resolve_cell(cfg)
        if uses_slurm(cfg):
            launcher, settings = "slurm", composed_settings(cfg)
        else:
            gpus = 1 if cell.device == "cuda" else 0
            launcher, settings = "local", SlurmSettings(gpus_per_task=gpus, startup_s=0.0)
        problem = (
            f"{cell.device} {cell.dtype}, heads {cell.heads_q}:{cell.heads_kv}x{cell.head_dim}"
        )
        rows.append(
            (
                " ".join(job) or "(defaults)",
                launcher,
                job_shape(cell, settings),
                len(cell.seqlens),
                problem,
            )
        )
    return rows


def print_plan(overrides: list[str], multirun: bool) -> int:
    """Print every job's shape and the sweep's cost bound; submits and runs nothing."""
    rows = plan_rows(overrides, multirun)
    table = Table(title=f"dry run: {len(rows)} job(s), nothing submitted")
    for column in ("#", "job", "launcher", "shape", "problem", "lengths", "GPU-h ≤"):
        table.add_column(column)
    gpu_hours = core_hours = 0.0
    for i, (job, launcher, shape, lengths, problem) in enumerate(rows):
        gpu_hours += shape.gpu_hours()
        core_hours += shape.tasks * shape.cpus_per_task * shape.timeout_min / 60
        text = (
            shape.describe()
            if launcher == "slurm"
            else (
                f"{shape.tasks} local process(es), {shape.gpus} GPU(s), "
                f"up to {shape.timeout_min} min (bench.timeout_s x lengths)"
            )
        )
        table.add_row(
            str(i), job, launcher, text, problem, str(lengths), f"{shape.gpu_hours():.2f}"
        )
    Console(width=200).print(table)
    print(
        f"total: {len(rows)} job(s), at most {gpu_hours:.1f} GPU-hours "
        f"({core_hours:.1f} CPU core-hours) from the time limits"
    )
    return 0
