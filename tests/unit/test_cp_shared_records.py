"""Records of ranks that shared a GPU keep numerics and bytes; no throughput view uses their times.

A numerics-only CP run over gloo on one GPU (`shared_device`) measures nothing about speed: the
report's frame and figures, the W&B history and summary and the planner's calibration points
must leave its times and TFLOP/s out, while its errors, bytes and memory stay — and so must the
end-of-sweep summary's headline, the planner figure's measured points and the set-up times.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from lcab.plan.calibrate import points_of
from lcab.plan.figure import measured_points, scaling_figure
from lcab.plot.png import draw
from lcab.records.schema import TIMING_COLUMNS, RunRecord
from lcab.records.sinks import RECORDS_FILE, write_records
from lcab.records.summary import summarise_sweep
from lcab.records.wandb_run import WandbLogger
from lcab.report.figures import NUMERICS, THROUGHPUT, metric_panel
from lcab.report.frame import load_records
from lcab.report.plot_style import Styler


def _record(seqlen: int, tflops: float, shared: bool) -> RunRecord:
    record = RunRecord(
        run_id=f"r{seqlen}",
        kernel="ranges",
        cp="ring",
        mask="causal",
        seqlen=seqlen,
        status="ok",
        passes=["fwd"],
        heads_q=4,
        heads_kv=2,
        head_dim=16,
        dtype="float32",
        device="cuda",
        world_size=2,
        nodes=1,
        devices_per_node=2,
        mask_seed=0,
        config={"mask": {}, "cp": {}},
        comm_bytes_measured=4096,
        comm_bytes_analytic=4096,
        shared_device=shared,
    )
    fwd = record.fwd
    fwd.status, fwd.ms_p50, fwd.ms_p20, fwd.ms_p80 = "ok", 2.0, 1.9, 2.1
    fwd.flops, fwd.tflops, fwd.max_abs_err, fwd.mem_peak_mib = 10**9, tflops, 1e-3, 12.0
    return record


def test_measured_flat_empties_only_the_timings_of_a_shared_record():
    shared, own = _record(256, 7.0, True).measured_flat(), _record(256, 7.0, False).measured_flat()
    assert all(shared[c] is None for c in TIMING_COLUMNS)
    assert own["fwd_tflops"] == 7.0 and own["fwd_ms_p50"] == 2.0
    for kept in ("fwd_max_abs_err", "fwd_mem_peak_mib", "comm_bytes_measured", "fwd_flops"):
        assert shared[kept] == own[kept]
    assert RunRecord.from_dict(_record(256, 7.0, True).to_dict()).shared_device is True


def test_report_draws_no_throughput_from_a_shared_record(tmp_path: Path):
    records = [_record(256, 3.0, False), _record(512, 100.0, True)]
    (tmp_path / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    frame = load_records([tmp_path])
    styler = Styler(frame)
    speed = metric_panel(frame, styler, "fwd", THROUGHPUT)
    assert [line.y for line in speed.lines] == [(3.0,)]  # the 512 record adds no point
    assert not speed.failed  # and is no failure either: it ran ok
    errors = metric_panel(frame, styler, "fwd", NUMERICS)
    assert [line.x for line in errors.lines] == [(256.0, 512.0)]  # numerics of both


class _Run:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, row: dict) -> None:
        self.rows.append(row)


def test_wandb_logs_no_time_or_throughput_of_a_shared_record():
    logger = object.__new__(WandbLogger)
    logger.records, logger._logged, logger._broken = [], set(), False
    logger.run = _Run()
    logger.run.config = SimpleNamespace(update=lambda *a, **k: None)
    logger.log(_record(256, 3.0, False))
    logger.log(_record(512, 100.0, True))
    own, shared = logger.run.rows
    assert own["fwd_tflops"] == 3.0 and "fwd_tflops" not in shared and "fwd_ms_p50" not in shared
    assert shared["fwd_max_abs_err"] == 1e-3 and shared["comm_bytes_measured"] == 4096
    summary = logger._summary()
    assert summary["fwd_tflops/256"] == 3.0 and "fwd_tflops/512" not in summary
    assert summary["headline/seqlen"] == 512 and summary["headline/fwd_tflops"] is None


def test_calibration_takes_no_point_from_a_shared_record():
    assert len(points_of([_record(256, 3.0, False)])) == 1
    assert points_of([_record(256, 3.0, True)]) == []


def test_the_sweep_summary_headline_shows_no_throughput_of_a_shared_record(tmp_path: Path):
    """The end-of-sweep table's headline (records/summary.py) read a shared record's TFLOP/s."""
    own = tmp_path / "0_cp=ring"
    shared = tmp_path / "1_cp=ring_shared"
    own.mkdir()
    shared.mkdir()
    write_records(own / RECORDS_FILE, [_record(256, 3.0, False)])
    write_records(shared / RECORDS_FILE, [_record(256, 3.0, False), _record(512, 100.0, True)])
    rows = {row.cell: row.headline for row in summarise_sweep(tmp_path)}
    assert rows["0_cp=ring"] == "S=256, fwd 3 TFLOP/s"
    assert rows["1_cp=ring_shared"] == "S=512, shared GPU (numerics only)"


def test_the_planner_figure_plots_no_measured_point_of_a_shared_record():
    records = [_record(256, 3.0, False), _record(512, 100.0, True)]
    assert measured_points(records, "causal", "ring", "fwd") == [(2, 3.0)]
    # drawn as crosses in the colour of the strategy's predicted line, on the report's renderer
    rows = [
        {"mask": "causal", "cp": cp, "world": w, "fwd_tflops": t}
        for cp, t in (("ring", 5.0), ("usp", 6.0))
        for w in (2, 4)
    ]
    figure = scaling_figure(rows, records)
    (panel,) = figure.panels
    lines = {line.label: line for line in panel.lines}
    assert set(lines) == {"ring (predicted)", "ring (measured)", "usp (predicted)"}
    measured, predicted = lines["ring (measured)"], lines["ring (predicted)"]
    assert measured.markers_only and (measured.x, measured.y) == ((2,), (3.0,))
    assert (predicted.x, predicted.y) == ((2, 4), (5.0, 5.0)) and not predicted.markers_only
    assert measured.colour == predicted.colour != lines["usp (predicted)"].colour
    legend = [t.get_text() for t in draw(figure).legends[0].get_texts()]
    assert sorted(legend) == sorted(lines)


def test_setup_times_are_timings_too():
    """Set-up times are read off the same clock: W&B (measured_flat) logs none of a shared one."""
    record = _record(256, 7.0, True)
    record.setup_mask_ms, record.setup_prepare_ms, record.setup_first_call_ms = 1.0, 2.0, 3.0
    flat = record.measured_flat()
    assert flat["setup_mask_ms"] is None and flat["setup_first_call_ms"] is None
    assert _record(256, 7.0, False).measured_flat()["setup_mask_ms"] is None  # never set here
    own = _record(256, 7.0, False)
    own.setup_prepare_ms = 2.0
    assert own.measured_flat()["setup_prepare_ms"] == 2.0
