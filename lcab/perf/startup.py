"""Start-up figures: how long the first commands a user types take, as the user would time them.

Each figure is the wall time of a fresh ``python -m ...`` process against its target in
`figures`, the commands read from the guides; ``LCAB_PERF_AGAINST=DIR[:DIR...]`` times the
`PAIRED` figures of other checkouts side by side, in rotating rounds (``$LCAB_PERF_RUNS``,
default 5) so a shared host's load falls on all alike. Figures: ``lcab/plan/README.md``.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900


@dataclass(frozen=True)
class Figure:
    """One start-up figure: a command, how often it is timed, its target."""

    label: str
    argv: tuple[str, ...]
    repeats: int
    target_s: float
    warmup: int = 0
    """Untimed runs first (``--help`` fills its cache of the composed config once)."""


def guide_commands(path: Path) -> list[str]:
    """The commands of ``path``'s ``bash`` blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


def first_command(path: Path, prefix: str) -> tuple[str, ...]:
    """The words of the first command of ``path`` that starts with ``prefix`` (ValueError: none)."""
    for command in guide_commands(path):
        if command.startswith(prefix):
            return tuple(shlex.split(command))
    raise ValueError(f"{path.relative_to(ROOT)} has no command starting with {prefix!r}")


def figures() -> list[Figure]:
    """The start-up figures, the documented commands read from their guides."""
    python = (sys.executable, "-m")
    cell = shlex.split(
        "launcher=slurm_h100_example cp=ring kernel=fa3 mask=causal_document topology=12x8 "
        "problem.device=cuda dry_run=true"
    )
    sweep = first_command(ROOT / "lcab" / "launch" / "README.md", "python -m lcab.main -m ")
    plan = first_command(ROOT / "README.md", "python -m lcab.plan")
    advice = first_command(ROOT / "README.md", "python -m lcab.plan recommend=true")
    cp_example = first_command(ROOT / "README.md", "python -m lcab.main -m cp=")
    return [
        Figure("python -m lcab.main --help", (*python, "lcab.main", "--help"), 5, 3.0, warmup=1),
        Figure("python -m lcab.plan --help", (*python, "lcab.plan", "--help"), 5, 3.0, warmup=1),
        Figure("dry run of one 96-GPU cell", (*python, "lcab.main", *cell), 3, 5.0),
        Figure(
            "dry run of the SLURM guide's scaling sweep",
            (*python, *sweep[2:], "dry_run=true"),
            1,
            20.0,
        ),
        Figure("README's first planner command", (*python, *plan[2:]), 1, 10.0),
        Figure("README's recommendation", (*python, *advice[2:]), 1, 10.0),
        Figure("README's context-parallel example", (*python, *cp_example[2:]), 1, 180.0),
    ]


def wall_s(argv: tuple[str, ...], cwd: Path, tree: Path | None = None) -> float:
    """Seconds ``argv`` took to run to completion (RuntimeError if it failed).

    ``tree``: a checkout whose ``lcab`` (and ``conf/``) the command imports instead of this one.
    """
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=env
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(argv)} exited with {done.returncode}: {done.stderr.strip()[-1000:]}"
        )
    return seconds


def measure(figure: Figure, cwd: Path) -> list[float]:
    """The wall times of ``figure``'s timed runs."""
    for _ in range(figure.warmup):
        wall_s(figure.argv, cwd)
    return [wall_s(figure.argv, cwd) for _ in range(figure.repeats)]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


PAIRED = (
    "python -m lcab.main --help",
    "dry run of one 96-GPU cell",
    "README's first planner command",
    "README's recommendation",
)
"""The figures timed side by side (``$LCAB_PERF_AGAINST``)."""


def run_pairs(trees: list[Path], rounds: int) -> None:
    """Print the `PAIRED` figures of each checkout in ``trees``, timed in alternating rounds."""
    print(f"start-up figures side by side, {rounds} rounds; {_load()}")
    with tempfile.TemporaryDirectory(prefix="lcab-startup-") as folder:
        for figure in (f for f in figures() if f.label in PAIRED):
            runs: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in trees}
            for tree in trees * figure.warmup:
                wall_s(figure.argv, Path(folder), tree)
            for turn in range(rounds):
                for tree in trees[turn % len(trees) :] + trees[: turn % len(trees)]:
                    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
                    wall = wall_s(figure.argv, Path(folder), tree)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu_s = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
                    runs[tree].append((wall, cpu_s))
            print(f"{figure.label}: {shlex.join(('python', *figure.argv[1:]))}")
            for tree, pairs in runs.items():
                walls = [wall for wall, _ in pairs]
                print(
                    f"    {tree}: {statistics.median(walls):.2f} s wall "
                    f"({min(walls):.2f}-{max(walls):.2f}), "
                    f"{statistics.median(cpu for _, cpu in pairs):.2f} CPU-s"
                )
    print(f"after: {_load()}")


def run() -> None:
    """Print every start-up figure against its target (``$LCAB_PERF_AGAINST``: side by side)."""
    if against := os.environ.get("LCAB_PERF_AGAINST"):
        others = [Path(p).resolve() for p in against.split(os.pathsep)]
        run_pairs([ROOT, *others], max(int(os.environ.get("LCAB_PERF_RUNS", "5")), 1))
        return
    print(f"start-up figures, wall time of fresh processes; {_load()}")
    with tempfile.TemporaryDirectory(prefix="lcab-startup-") as folder:
        cwd = Path(folder)
        torch_s = [wall_s((sys.executable, "-c", "import torch"), cwd) for _ in range(3)]
        print(
            f"reference: python -c 'import torch' {statistics.median(torch_s):.2f} s (median of 3)"
        )
        for figure in figures():
            times = measure(figure, cwd)
            median = statistics.median(times)
            runs = f"median of {len(times)}" if len(times) > 1 else "1 run (slow: one timed run)"
            spread = f", {min(times):.2f}-{max(times):.2f} s" if len(times) > 1 else ""
            warm = f", after {figure.warmup} untimed" if figure.warmup else ""
            verdict = "met" if median <= figure.target_s else "MISSED"
            print(
                f"{figure.label}: {median:.2f} s ({runs}{spread}{warm}); "
                f"target <= {figure.target_s:g} s: {verdict}"
            )
            print(f"    {shlex.join(('python', *figure.argv[1:]))}")
    print(f"after: {_load()}")
