"""The end-of-sweep table: one row per cell, statuses and a headline from its largest ok length."""

from __future__ import annotations

from rich.console import Console

from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, JsonlSink, merge_records
from lcab.records.summary import print_sweep_summary, summarise_sweep


def _record(seqlen: int, status: str, fwd: float | None) -> RunRecord:
    record = RunRecord(kernel="ranges", mask="causal", seqlen=seqlen, passes=["fwd", "bwd"])
    record.status = status
    record.fwd.tflops = fwd
    return record


def test_each_cell_gets_its_statuses_and_the_headline_of_its_largest_ok_length(tmp_path):
    cells = {
        "10_kernel=sparse": [(1024, "ok", 1.5), (4096, "ok", 2.5), (8192, "timeout", None)],
        "2_kernel=ranges": [(1024, "error", None)],
    }
    for name, rows in cells.items():
        sink = JsonlSink(tmp_path / name / RECORDS_FILE)
        for seqlen, status, fwd in rows:
            sink.write(_record(seqlen, status, fwd))
    (tmp_path / "10_kernel=sparse" / "wandb-run-id").write_text("abc123\n")
    rows = summarise_sweep(tmp_path)
    assert [r.cell for r in rows] == ["2_kernel=ranges", "10_kernel=sparse"]  # job order
    assert rows[0].statuses == "1 error" and rows[0].headline == "-"
    assert rows[1].statuses == "2 ok, 1 timeout"
    assert rows[1].headline == "S=4,096, fwd 2.5 TFLOP/s" and rows[1].wandb_run == "abc123"


def test_the_summary_ends_with_where_the_results_are_and_the_commands_that_use_them(tmp_path):
    sink = JsonlSink(tmp_path / "0_kernel=ranges" / RECORDS_FILE)
    sink.write(_record(1024, "ok", 1.0))
    (tmp_path / "0_kernel=ranges" / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)
    merged, csv, _ = merge_records(tmp_path)
    console = Console(record=True, width=400)
    print_sweep_summary(tmp_path, merged, csv, console=console)
    text = console.export_text()
    assert f"records: {merged}" in text and str(csv) in text
    assert f"python -m lcab.report build {tmp_path}" in text
    assert f"wandb sync {tmp_path}/*/wandb/offline-run-*" in text
