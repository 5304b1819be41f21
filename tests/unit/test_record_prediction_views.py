"""The prediction every record carries, as the console, the report and W&B show it."""

from __future__ import annotations

import csv
import html
from types import SimpleNamespace

import pytest
from rich.console import Console

from lcab.plan.record_prediction import attach
from lcab.records.schema import RunRecord
from lcab.records.table import print_table, records_table
from lcab.report.build import build_report
from tests.helpers.synthetic_records import failed, measured, write_sweep


def _prediction(fwd_ms: float, bwd_ms: float) -> SimpleNamespace:
    fwd = SimpleNamespace(time_ms=fwd_ms, tflops=1.0)
    bwd = SimpleNamespace(time_ms=bwd_ms, tflops=1.0)
    return SimpleNamespace(fwd=fwd, bwd=bwd, pass_=lambda name: fwd if name == "fwd" else bwd)


def _predicted(record: RunRecord, fwd_ms: float, bwd_ms: float) -> RunRecord:
    record.predicted_hardware = "hw"
    attach(record, _prediction(fwd_ms, bwd_ms))
    return record


@pytest.fixture
def records() -> list[RunRecord]:
    """On the plan (fwd 10 ms, bwd 25 measured and predicted); 5x slower forward; a failed
    record with a prediction; an old record without one."""
    return [
        _predicted(measured("ranges", "causal", 1024, ms=10.0), 10.0, 25.0),
        _predicted(measured("ranges", "causal", 2048, ms=10.0), 2.0, 25.0),
        _predicted(failed("ranges", "causal", 4096, "timeout", "took too long"), 40.0, 100.0),
        measured("sdpa", "causal", 1024, ms=10.0, job=1),
    ]


def test_console_shows_each_pass_ratio_and_the_warning(records) -> None:
    console = Console(width=250, record=True)
    print_table(records, out=console)
    text = console.export_text()
    table, _ = records_table(records)
    cells = {c.header: list(c.cells) for c in table.columns}
    assert "vs plan\nfwd/bwd" in cells
    rows = {
        (k, s): {h: cells[h][i] for h in cells}
        for i, (k, s) in enumerate(zip(cells["kernel"], cells["seqlen"], strict=True))
    }
    ratio = {key: row["vs plan\nfwd/bwd"] for key, row in rows.items()}
    assert ratio["ranges", "1,024"] == "1x/1x" and ratio["ranges", "2,048"] == "[red]0.2x/1x[/]"
    note = rows["ranges", "2,048"]["note"].lstrip("\\")  # the warning is a numbered note
    assert note in ("[1]", "[2]")
    notes = [line for line in text.splitlines() if line.startswith(note + " ")]
    assert len(notes) == 1 and notes[0].startswith(f"{note} off the plan: fwd 0.2x")
    assert ratio["sdpa", "1,024"] == "-"  # no prediction


def test_report_has_the_ratio_columns_and_a_measured_vs_predicted_table(records, tmp_path):
    sweep = write_sweep(tmp_path / "sweep", [records[:3], records[3:]])
    built = build_report([sweep])
    with open(built.folder / "predicted.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    # ok records with a prediction only, furthest from the plan first
    assert (rows[0]["seqlen"], rows[0]["pass"]) == ("2048", "fwd")
    assert sorted((r["seqlen"], r["pass"]) for r in rows) == [
        ("1024", "bwd"),
        ("1024", "fwd"),
        ("2048", "bwd"),
        ("2048", "fwd"),
    ]
    first = rows[0]
    assert float(first["ratio"]) == pytest.approx(0.2) and first["flag"] == "off the plan"
    assert float(first["measured_ms"]) == 10.0 and float(first["predicted_ms"]) == 2.0
    assert all(r["flag"] == "" for r in rows[1:])
    headline = "3 of 4 passes within ±30% of the planner's prediction; 1 off the plan"
    assert (built.folder / "predicted.md").read_text().startswith(headline)
    page = built.index.read_text()
    assert 'id="predicted"' in page and html.escape(headline) in page
    with open(built.folder / "summary.csv", newline="") as fh:
        summary = {r["run_id"]: r for r in csv.DictReader(fh)}
    assert float(summary[records[1].run_id]["fwd_predicted_ratio"]) == pytest.approx(0.2)
    assert summary[records[3].run_id]["fwd_predicted_ratio"] == ""  # no prediction


def test_wandb_summary_has_the_predictions_and_the_warnings(records) -> None:
    from lcab.records.wandb_run import WandbLogger

    logger = object.__new__(WandbLogger)  # the summary reads only the records
    logger.records = records[:3]
    summary = logger._summary()
    assert summary["fwd_predicted_ratio/2048"] == pytest.approx(0.2)
    assert summary["bwd_predicted_ratio/1024"] == pytest.approx(1.0)
    assert summary["fwd_predicted_tflops/1024"] == pytest.approx(1.0)
    assert summary["n_prediction_warnings"] == 1
    assert summary["prediction_warning/2048"].startswith("off the plan: fwd 0.2x")
    assert "prediction_warning/1024" not in summary
    assert summary["headline/fwd_predicted_ratio"] == pytest.approx(0.2)  # largest ok length


def test_wandb_summary_has_a_frontier_cells_search() -> None:
    """A ``seqlen=frontier`` cell's run summary names its frontier, its peak and the plan's."""
    from lcab.records.wandb_run import WandbLogger

    record = measured("ranges", "causal", 6144)
    record.frontier_tokens, record.frontier_tokens_per_device = 6144, 1536
    record.frontier_peak_mib, record.frontier_bytes_per_token = 180.5, 30_000.0
    record.frontier_predicted_tokens = 8192
    record.frontier_predicted_ratio = 6144 / 8192
    logger = object.__new__(WandbLogger)
    logger.records = [measured("ranges", "causal", 1024), record]
    summary = logger._summary()
    assert summary["frontier/tokens"] == 6144 and summary["frontier/tokens_per_device"] == 1536
    assert summary["frontier/peak_mib"] == 180.5
    assert summary["frontier/predicted_tokens"] == 8192
    assert summary["frontier/predicted_ratio"] == pytest.approx(0.75)
    assert "frontier/budget_gib" not in summary  # unset fields are left out, not logged as None

    logger.records = [
        measured("ranges", "causal", 1024)
    ]  # an ordinary cell has no frontier keys at all
    assert not any(key.startswith("frontier/") for key in logger._summary())
