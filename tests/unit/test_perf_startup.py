"""``python -m lcab.perf startup`` times the documented commands, read from their guides.

The expectations are the guides' own lines (found here by a plain line scan, not by the topic's
block parser) and commands whose outcome is known (a failing one, one that counts its runs).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from lcab.perf import startup

ROOT = Path(__file__).resolve().parents[2]


def _continued(lines: list[str], start: int) -> str:
    """The command starting at ``lines[start]``, backslash continuations joined."""
    parts = []
    for line in lines[start:]:
        parts.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(parts)


def _first_line(path: Path, prefix: str) -> list[str]:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    return shlex.split(_continued(lines, start), comments=True)


def test_the_figures_time_the_commands_the_guides_document():
    by_label = {f.label: f for f in startup.figures()}
    sweep = by_label["dry run of the SLURM guide's scaling sweep"].argv
    guide = _first_line(ROOT / "lcab" / "launch" / "README.md", "python -m lcab.main -m ")
    assert sweep == (sys.executable, *guide[1:], "dry_run=true")
    plan = by_label["README's first planner command"].argv
    assert plan == (sys.executable, *_first_line(ROOT / "README.md", "python -m lcab.plan")[1:])
    cell = by_label["dry run of one 96-GPU cell"].argv
    assert {"topology=12x8", "cp=ring", "kernel=fa3", "dry_run=true"} <= set(cell)
    for label in ("python -m lcab.main --help", "python -m lcab.plan --help"):
        assert by_label[label].argv[-1] == "--help" and by_label[label].repeats == 5


def test_a_guide_without_the_command_is_named(tmp_path, monkeypatch):
    guide = tmp_path / "README.md"
    guide.write_text("```bash\npython -m lcab.main\n```\n")
    monkeypatch.setattr(startup, "ROOT", tmp_path)
    with pytest.raises(ValueError, match=r"README.md has no command starting with 'python -m x'"):
        startup.first_command(guide, "python -m x")


def test_a_failing_command_stops_the_figures(tmp_path):
    with pytest.raises(RuntimeError, match="exited with 3: boom"):
        startup.wall_s(
            (sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"),
            tmp_path,
        )


def test_measure_runs_the_warmup_untimed_then_each_repeat(tmp_path):
    counter = tmp_path / "runs"
    code = f"open({str(counter)!r}, 'a').write('x')"
    figure = startup.Figure("count", (sys.executable, "-c", code), repeats=3, target_s=1, warmup=2)
    times = startup.measure(figure, tmp_path)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert counter.read_text() == "x" * 5


def test_checkouts_side_by_side_run_their_own_code_in_alternating_rounds(
    tmp_path, monkeypatch, capsys
):
    log = tmp_path / "ran"
    trees = []
    for name in ("mine", "other"):
        (tmp_path / name / "lcab").mkdir(parents=True)
        (tmp_path / name / "lcab" / "__init__.py").write_text(
            f"open({str(log)!r}, 'a').write({name!r} + ' ')\n"
        )
        trees.append(tmp_path / name)
    label = startup.PAIRED[0]
    figure = startup.Figure(label, (sys.executable, "-c", "import lcab"), 5, 1.0, warmup=1)
    unpaired = startup.Figure("not paired", (sys.executable, "-c", "raise SystemExit(1)"), 1, 1.0)
    monkeypatch.setattr(startup, "figures", lambda: [figure, unpaired])
    startup.run_pairs(trees, rounds=3)
    # one untimed run each, then rounds whose first checkout rotates
    warmup, rounds = ["mine", "other"], ["mine", "other", "other", "mine", "mine", "other"]
    assert log.read_text().split() == warmup + rounds
    out = capsys.readouterr().out
    assert "3 rounds" in out and "not paired" not in out
    assert all(f"    {tree}: " in out for tree in trees)
