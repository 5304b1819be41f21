"""The report's telemetry: the clocks-over-time figure, the share of the peak, implausible passes.

Records are built here with GPU-like telemetry whose every number is set by hand — an H200
whose SM clock sinks from 1,980 to 1,755 MHz over a 14-minute sweep while its power climbs, the
driver capping power (``SwPowerCap``) once the clock falls below 1,850 MHz, and one forward pass
at 130 % of the peak — so each expectation below is computed from these inputs, not read back
from the report's code.
"""

from __future__ import annotations

import csv
import html
import math
import struct
from pathlib import Path
from typing import NamedTuple

import pytest

from lcab.plot.data import LineFigure, Panel
from lcab.plot.html import to_plotly
from lcab.plot.png import draw
from lcab.records.schema import PassResult, RunRecord
from lcab.report.build import BuiltReport, build_report
from lcab.report.figures import build_figures
from lcab.report.frame import load_records
from tests.helpers.synthetic_records import LENGTHS, measured, write_sweep

SWEEP = "h200-sweep"
STEPS = 8
"""Records of the GPU sweep: one every 2 minutes, the clock falling evenly over them."""
FIRST_MHZ, LAST_MHZ = 1980.0, 1755.0
CAPPED_BELOW = 1850.0
"""Passes whose median clock is below this carry SwPowerCap (the others only GpuIdle)."""
PEAK_AT_1980 = 989.4
"""The device's dense bf16 peak (TFLOP/s) at 1,980 MHz; it scales with the clock."""
IMPLAUSIBLE_STEP = 5
"""The record whose forward pass ran at 130 % of the peak."""
NOTE = "above the device's peak at its clock: FLOP count or timer error"


def _clock(step: int) -> float:
    return FIRST_MHZ + (LAST_MHZ - FIRST_MHZ) * step / (STEPS - 1)


def _gpu_pass(seqlen: int, flops: int, share: float, median: float, watts: float) -> PassResult:
    peak = PEAK_AT_1980 * median / FIRST_MHZ
    tflops = share * peak
    ms = flops / (tflops * 1e12) * 1e3
    events = ["SwPowerCap"] if median < CAPPED_BELOW else ["GpuIdle"]
    return PassResult(
        status="ok",
        ms_p20=0.98 * ms,
        ms_p50=ms,
        ms_p80=1.03 * ms,
        reps=20,
        flops=flops,
        tflops=tflops,
        clock_mhz_min=median - 30.0,
        clock_mhz_median=median,
        clock_mhz_max=min(FIRST_MHZ, median + 15.0),
        mem_clock_mhz=3201.0,
        power_w=watts,
        power_w_max=watts,
        energy_j=watts * ms / 1e3,
        energy_j_per_token=watts * ms / 1e3 / seqlen,
        temperature_c=45.0 + 3 * (watts - 500) / 20,
        clock_events=events,
        peak_tflops=peak,
        peak_share=tflops / peak,
        peak_implausible=share > 1,
    )


def gpu_record(step: int, kernel: str) -> RunRecord:
    """Step ``step`` of the sweep: 4K·2^(step mod 4) tokens, clock `_clock`, power rising."""
    seqlen = 4096 << (step % 4)
    flops = 4 * seqlen * seqlen * 128 * 32 // 2
    median, watts = _clock(step), 520.0 + 25.0 * step
    fwd_share = 1.3 if step == IMPLAUSIBLE_STEP else 0.55 + 0.02 * step
    record = RunRecord(
        run_id=f"{SWEEP}-{step}",
        sweep_id=SWEEP,
        job_num=step // 4,
        created_at=f"2026-03-01T10:{2 * step:02d}:00+00:00",
        kernel=kernel,
        mask="causal",
        seqlen=seqlen,
        heads_q=32,
        heads_kv=32,
        head_dim=128,
        dtype="bfloat16",
        device="cuda",
        device_name="NVIDIA H200",
        passes=["fwd", "bwd"],
        status="ok",
        fwd=_gpu_pass(seqlen, flops, fwd_share, median, watts),
        bwd=_gpu_pass(seqlen, int(2.5 * flops), 0.45, median - 10.0, watts + 20.0),
        telemetry_source="nvml",
        telemetry_device="NVIDIA H200",
    )
    if record.fwd.peak_implausible:
        record.reasons.append(
            f"fwd: {record.fwd.tflops:,.1f} TFLOP/s is 130% of the NVIDIA H200's bfloat16 peak "
            f"at {median:,.0f} MHz ({record.fwd.peak_tflops:,.1f}): implausible, the FLOP "
            "count or the timer is wrong"
        )
    return record


def gpu_records() -> list[RunRecord]:
    return [gpu_record(step, "sdpa" if step < 4 else "flash") for step in range(STEPS)]


@pytest.fixture(scope="module")
def gpu_report(tmp_path_factory: pytest.TempPathFactory) -> BuiltReport:
    records = gpu_records()
    sweep = write_sweep(tmp_path_factory.mktemp("gpu"), [records[:4], records[4:]])
    return build_report([sweep])


def clock_figure(figures: list) -> LineFigure:
    (figure,) = [f for f in figures if f.section == "telemetry"]
    assert isinstance(figure, LineFigure) and figure.stacked and not figure.x.log
    return figure


RINGED = "clock events: "
NUDGE = {"fwd": -0.006, "bwd": 0.006}
"""Where each pass is drawn beside its minute, as a share of the sweep's span (fwd left)."""


class Point(NamedTuple):
    x: float
    pass_name: str
    y: float
    low: float | None
    high: float | None
    events: tuple[str, ...]
    hover: str


def points(panel: Panel, span: float) -> list[Point]:
    """A clock panel's markers as points at the minute their length began (nudge undone),
    each with the events of the ring drawn around it (none: not ringed)."""
    rings = {
        (x, y): tuple(line.label.removeprefix(RINGED).split(", "))
        for line in panel.lines
        if line.label.startswith(RINGED)
        for x, y in zip(line.x, line.y, strict=True)
    }
    out = []
    for line in panel.lines:
        if line.label.startswith(RINGED):
            continue
        pass_ = line.label.rsplit(" · ", 1)[1]
        for i, (x, y) in enumerate(zip(line.x, line.y, strict=True)):
            low = None if line.low is None or math.isnan(line.low[i]) else line.low[i]
            high = None if line.high is None or math.isnan(line.high[i]) else line.high[i]
            minute = round(x - NUDGE[pass_] * span, 9)
            out.append(Point(minute, pass_, y, low, high, rings.get((x, y), ()), line.hover[i]))
    return out


def summary_rows(report: BuiltReport) -> dict[str, dict[str, str]]:
    with open(report.folder / "summary.csv", newline="") as fh:
        return {row["run_id"]: row for row in csv.DictReader(fh)}


def markdown_rows(report: BuiltReport) -> dict[str, dict[str, str]]:
    lines = [line for line in (report.folder / "summary.md").read_text().splitlines() if line]
    table = [line for line in lines if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for line in table[2:]
    ]
    return {row["run_id"]: row for row in rows}


# ------------------------------------------------------------------------- the clock figure
def test_the_clock_figure_is_drawn_as_a_png_and_on_the_page(gpu_report):
    name = f"clocks_{SWEEP}"
    assert name in gpu_report.figures
    png = gpu_report.png_dir / f"{name}.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 1000 and height > 800  # two stacked panels and a legend
    page = gpu_report.index.read_text()
    assert f'id="plot-{name}"' in page and '<a href="#telemetry">Clocks and power</a>' in page
    assert not any("telemetry" in why for why in gpu_report.omitted)


def test_clock_points_are_the_records_readings_against_minutes_into_the_sweep():
    records = gpu_records()
    figure = clock_figure(build_figures(load_records_of(records)).figures)
    assert "NVIDIA H200" in figure.title and figure.x.label.startswith("minutes")
    assert "MHz" in figure.panels[0].y_label and "W" in figure.panels[1].y_label
    clock, power = (points(panel, 2.0 * (STEPS - 1)) for panel in figure.panels)
    expected = sorted(
        (2.0 * step, p, r.pass_result(p)) for step, r in enumerate(records) for p in ("fwd", "bwd")
    )
    got = sorted((pt.x, pt.pass_name, pt) for pt in clock)
    assert len(got) == len(expected) == 2 * STEPS
    for (x, pass_, result), (gx, gpass, point) in zip(expected, got, strict=True):
        assert (gx, gpass) == (x, pass_)
        assert point.y == result.clock_mhz_median
        assert (point.low, point.high) == (result.clock_mhz_min, result.clock_mhz_max)
    # the clock really falls 1,980 -> 1,755 MHz over the 14 minutes
    fwd = sorted((p.x, p.y) for p in clock if p.pass_name == "fwd")
    assert fwd[0] == (0.0, FIRST_MHZ) and fwd[-1] == (14.0, LAST_MHZ)
    assert sorted((p.x, p.pass_name, p.y) for p in power) == sorted(
        (2.0 * s, p, r.pass_result(p).power_w)
        for s, r in enumerate(records)
        for p in ("fwd", "bwd")
    )


def test_capped_passes_are_flagged_with_their_reason_and_idle_ones_are_not():
    records = gpu_records()
    figure = clock_figure(build_figures(load_records_of(records)).figures)
    capped = {
        (2.0 * s, p)
        for s, r in enumerate(records)
        for p in ("fwd", "bwd")
        if r.pass_result(p).clock_mhz_median < CAPPED_BELOW
    }
    assert 0 < len(capped) < 2 * STEPS
    clock = points(figure.panels[0], 2.0 * (STEPS - 1))
    flagged = {(p.x, p.pass_name) for p in clock if p.events}
    assert flagged == capped
    assert {p.events for p in clock if p.events} == {("SwPowerCap",)}
    names = [t.name for t in to_plotly(figure).data]
    assert "clock events: SwPowerCap" in names
    legend = [t.get_text() for t in draw(figure).legends[0].get_texts()]
    assert "clock events: SwPowerCap" in legend
    assert {t.rsplit(" · ", 1)[-1] for t in legend if " · " in t} == {"fwd", "bwd"}
    # every point's hover names its reasons, GpuIdle included
    idle = [p for p in clock if not p.events]
    assert idle and all("clock events: GpuIdle" in p.hover for p in idle)


# ------------------------------------------------------------------------- the summary table
def test_the_implausible_pass_is_marked_in_every_form_of_the_summary(gpu_report):
    records = {r.run_id: r for r in gpu_records()}
    odd = f"{SWEEP}-{IMPLAUSIBLE_STEP}"
    csv_rows = summary_rows(gpu_report)
    assert {k: row["above_peak"] for k, row in csv_rows.items()} == {
        k: "fwd" if k == odd else "" for k in records
    }
    assert float(csv_rows[odd]["fwd_tflops"]) == records[odd].fwd.tflops  # the CSV keeps numbers
    md = markdown_rows(gpu_report)
    for run_id, row in md.items():
        marked = run_id == odd
        assert row["fwd_tflops"].endswith("!") is marked, run_id
        assert not row["bwd_tflops"].endswith("!")
    assert md[odd]["fwd_tflops"] == f"{records[odd].fwd.tflops:.4g}!"
    assert NOTE in (gpu_report.folder / "summary.md").read_text()
    page = html.unescape(gpu_report.index.read_text())
    assert f"<td>{records[odd].fwd.tflops:.4g}!</td>" in page and NOTE in page
    # the record's own reason line is in the reasons table
    assert (
        "implausible, the FLOP count or the timer is wrong"
        in (gpu_report.folder / "reasons.md").read_text()
    )


def test_share_of_peak_and_energy_columns_are_the_records_figures(gpu_report):
    records = {r.run_id: r for r in gpu_records()}
    rows = summary_rows(gpu_report)
    header = list(next(iter(rows.values())))
    assert header.index("fwd_peak_pct") > header.index("bwd_tflops")
    for run_id, row in rows.items():
        for pass_ in ("fwd", "bwd"):
            result = records[run_id].pass_result(pass_)
            by_hand = result.tflops / result.peak_tflops * 100
            assert float(row[f"{pass_}_peak_pct"]) == pytest.approx(by_hand, rel=1e-12)
            energy = result.power_w * result.ms_p50 / 1e3 / records[run_id].seqlen
            assert float(row[f"{pass_}_energy_j_per_token"]) == pytest.approx(energy, rel=1e-12)
    assert float(rows[f"{SWEEP}-{IMPLAUSIBLE_STEP}"]["fwd_peak_pct"]) == pytest.approx(130.0)
    md_header = (gpu_report.folder / "summary.md").read_text().splitlines()[0]
    assert "fwd_peak_pct" in md_header and "bwd_energy_j_per_token" in md_header


# ------------------------------------------------------------------------- CPU records
def test_cpu_records_without_telemetry_get_no_clock_figure_and_no_telemetry_columns(tmp_path):
    sweep = write_sweep(tmp_path / "cpu", [[measured("sdpa", "causal", s) for s in LENGTHS]])
    report = build_report([sweep], out=tmp_path / "report")
    assert not [f for f in report.figures if f.startswith("clocks")]
    assert not list(report.png_dir.glob("clocks*"))
    assert not any("clock" in why for why in report.omitted)
    page = report.index.read_text()
    assert "Clocks and power" not in page and NOTE not in page
    with open(report.folder / "summary.csv", newline="") as fh:
        header = next(csv.reader(fh))
    md = (report.folder / "summary.md").read_text()
    for column in ("peak_pct", "energy_j_per_token", "above_peak"):
        assert not [c for c in header if column in c] and column not in md and column not in page


def test_a_cpu_at_one_steady_clock_is_left_out_and_a_moving_one_drawn():
    def cpu(steady: bool) -> list[RunRecord]:
        records = [measured("sdpa", "causal", s, sweep="cpu") for s in LENGTHS]
        for i, record in enumerate(records):
            record.created_at = f"2026-03-01T10:0{i}:30+00:00"
            record.telemetry_source, record.device_name = "host", "AMD EPYC"
            for pass_ in ("fwd", "bwd"):
                mhz = 2450.0 if steady else 3500.0 - 100.0 * i
                result = record.pass_result(pass_)
                result.clock_mhz_min = result.clock_mhz_median = result.clock_mhz_max = mhz
        return records

    figures = build_figures(load_records_of(cpu(steady=True)))
    assert not [f for f in figures.figures if f.section == "telemetry"]
    (why,) = [o.why for o in figures.omitted if o.section == "telemetry"]
    assert "one steady clock (2,450 MHz)" in why
    moving = clock_figure(build_figures(load_records_of(cpu(steady=False))).figures)
    assert "core clock" in moving.panels[0].y_label and len(moving.panels) == 1  # no power
    moved = points(moving.panels[0], 3.0)
    assert sorted(p.y for p in moved if p.pass_name == "fwd") == [
        3200.0,
        3300.0,
        3400.0,
        3500.0,
    ]
    assert [p.x for p in sorted(moved, key=lambda p: p.x)][::2] == [
        0.0,
        1.0,
        2.0,
        3.0,
    ]


def load_records_of(records: list[RunRecord]):
    """The report's frame of ``records`` (through a records file, as the report reads them)."""
    import tempfile

    from lcab.records.sinks import RECORDS_FILE, write_records

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / RECORDS_FILE
        write_records(path, records)
        return load_records([path])
