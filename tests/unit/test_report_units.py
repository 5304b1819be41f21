"""The report of a CPU sweep speaks the CPU's units, as the console does: GFLOP/s.

A newcomer's CPU report read "TFLOP/s per device" with axis ticks of 0.0025-0.0175 while the
console said GFLOP/s. Expectations are the records' own TFLOP/s times 1000, by hand.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lcab.plot.data import LineFigure
from lcab.records.schema import RunRecord
from lcab.report.build import build_report
from lcab.report.figures import build_figures
from lcab.report.frame import load_records
from tests.helpers.synthetic_records import measured, write_sweep


def _sweep(root: Path, device: str) -> tuple[Path, list[RunRecord]]:
    records = [measured("ranges", "causal", s, ms=s / 100) for s in (1024, 2048)]
    for record in records:
        record.device = device
        record.predicted_hardware = "cpu_gloo_local"
        record.fwd.predicted_tflops, record.fwd.predicted_ratio = 0.004, 1.1
        record.fwd.predicted_ms = record.fwd.ms_p50
    return write_sweep(root, [records]), records


@pytest.mark.parametrize(
    ("device", "unit", "factor"), [("cpu", "GFLOP/s", 1e3), ("cuda", "TFLOP/s", 1.0)]
)
def test_figures_and_tables_read_in_the_machines_units(tmp_path, device, unit, factor):
    root, records = _sweep(tmp_path / "sweep", device)
    figures = build_figures(load_records([root])).figures
    (figure,) = [f for f in figures if f.name == "throughput_causal"]
    assert isinstance(figure, LineFigure)
    forward = figure.panels[0]
    assert forward.y_label == f"{unit} per device"
    (line,) = forward.lines
    assert line.y == pytest.approx([r.fwd.tflops * factor for r in records], rel=1e-12)
    assert line.low is not None and line.high is not None
    assert all(lo < y < hi for lo, y, hi in zip(line.low, line.y, line.high, strict=True))

    built = build_report([root])
    name = "gflops" if device == "cpu" else "tflops"
    with open(built.folder / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(row[f"fwd_{name}"]) for row in rows] == pytest.approx(
        [r.fwd.tflops * factor for r in records], rel=1e-6
    )
    assert not any(c.endswith("_tflops" if device == "cpu" else "_gflops") for c in rows[0])
    with open(built.folder / "predicted.csv", newline="") as fh:
        predicted = list(csv.DictReader(fh))
    assert [float(row[f"predicted_{name}"]) for row in predicted] == pytest.approx(
        [0.004 * factor] * len(records)
    )
    assert f"throughput {unit} per device" in built.index.read_text()
