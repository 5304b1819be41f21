"""The memory frontier in the report: a figure per mask, a table, and nothing for other sweeps.

Expectations are computed here from the records written: tokens per device are the frontier
over the ranks, the planner's line the predicted frontier over the ranks, the table's bracket
the record's own pair.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lcab.records.schema import RunRecord
from lcab.report.build import build_report
from lcab.report.figures import build_figures
from lcab.report.frame import load_records
from tests.helpers.synthetic_records import measured, write_sweep

SEARCHES = [  # (cp, ranks, frontier, bracket, planner's frontier)
    ("none", 1, 2_432, [2_432, 2_560], 20_480),
    ("ulysses", 4, 9_728, [9_728, 10_240], 51_200),
    ("ring", 4, 9_216, [9_216, None], None),  # reached frontier_max; no plan for it
]


def _search(kernel: str, cp: str, world: int, tokens: int, bracket: list, planned: int | None):
    record: RunRecord = measured(kernel, "causal", tokens, cp=cp, world=world)
    record.frontier_tokens, record.frontier_tokens_per_device = tokens, tokens // world
    record.frontier_bracket = bracket
    record.frontier_probes = [{"seqlen": s, "status": "ok"} for s in (1024, 2048, tokens)]
    record.frontier_peak_mib, record.frontier_budget_gib = 190.0, 0.2
    if planned is not None:
        record.frontier_predicted_tokens = planned
        record.frontier_predicted_ratio = tokens / planned
    return record


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    jobs = [[_search("ranges", *search)] for search in SEARCHES]
    return write_sweep(tmp_path / "frontier_sweep", jobs)


def test_a_frontier_sweep_has_its_figure_with_measured_and_planned_lines(sweep: Path) -> None:
    figures = build_figures(load_records([sweep]))
    (figure,) = [f for f in figures.figures if f.section == "frontier"]
    assert figure.name == "frontier_causal" and "0.2 GiB" in figure.title
    lines = {line.label: line for line in figure.panels[0].lines}
    assert lines["ranges"].y == (2_432.0,) and lines["ranges"].x == (1.0,)
    assert lines["ranges (planner)"].y == (20_480.0,)
    ulysses = next(
        line for label, line in lines.items() if "ulysses" in label and "planner" not in label
    )
    assert ulysses.x == (4.0,) and ulysses.y == (9_728 / 4,)
    planned = [label for label in lines if "ring" in label and "planner" in label]
    assert planned == []  # the ring search has no planner frontier: no dashed line invented


def test_the_report_writes_the_frontier_table_and_section(sweep: Path, tmp_path: Path) -> None:
    built = build_report([sweep], tmp_path / "report")
    table = (built.folder / "frontier.md").read_text()
    assert "2,432 – 2,560" in table and "9,216 – none failed" in table
    csv = (built.folder / "frontier.csv").read_text().splitlines()
    assert len(csv) == 1 + len(SEARCHES)
    ulysses_row = next(line for line in csv if ",ulysses," in line)
    assert ",9728,2432," in ulysses_row and ulysses_row.endswith(",51200,0.19")  # 9728 / 51200
    page = built.index.read_text()
    assert 'id="frontier"' in page and "Memory frontier" in page and "9,216 – none failed" in page
    assert (built.png_dir / "frontier_causal.png").stat().st_size > 1000


def test_an_ordinary_sweep_has_no_frontier_section_or_files(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "plain", [[measured("ranges", "causal", 1024)]])
    built = build_report([sweep], tmp_path / "report")
    assert not (built.folder / "frontier.md").exists()
    assert 'id="frontier"' not in built.index.read_text()
    assert not any(name.startswith("frontier") for name in built.figures)
