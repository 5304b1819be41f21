"""`python -m lcab.report build`: records with known numbers in, the report's files and data out.

The records are built here (`tests.helpers.synthetic_records`), so every expectation — rows,
TFLOP/s and its band, failed lengths, table values — is computed from the inputs by hand, not
read back from the code under test.
"""

from __future__ import annotations

import csv
import json
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lcab.plot.data import Heatmap, Line, LineFigure, log_ticks, seqlen_label
from lcab.plot.html import plotly_js, to_plotly
from lcab.plot.png import draw
from lcab.records.sinks import RECORDS_FILE, write_records
from lcab.report.__main__ import main
from lcab.report.build import BuiltReport, build_report
from lcab.report.figures import build_figures, stacked
from lcab.report.frame import load_records, record_files, variant_labels
from lcab.report.plot_data import Figures
from lcab.report.plot_style import SERIES_COLOURS, palette
from lcab.report.tables import reasons_table
from tests.helpers.synthetic_records import (
    LENGTHS,
    cp_jobs,
    example_sweeps,
    kernel_jobs,
    measured,
    write_sweep,
)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return example_sweeps(tmp_path_factory.mktemp("sweeps"))


@pytest.fixture(scope="module")
def built(sweeps: tuple[Path, Path]) -> BuiltReport:
    return build_report(list(sweeps))


@pytest.fixture(scope="module")
def figures(sweeps: tuple[Path, Path]) -> Figures:
    return build_figures(load_records(list(sweeps)))


def all_records() -> list:
    return [r for job in kernel_jobs() + cp_jobs() for r in job]


def line_figure(figures: Figures, name: str) -> LineFigure:
    (figure,) = [f for f in figures.figures if f.name == name]
    assert isinstance(figure, LineFigure)
    return figure


# ------------------------------------------------------------------------------------ loading
def test_a_sweep_is_read_from_its_job_files_without_counting_the_merged_copy(sweeps):
    kernels, _ = sweeps
    assert (kernels / RECORDS_FILE).exists()  # the merged copy is there, and must not count
    frame = load_records([kernels])
    assert len(frame) == 16
    assert frame["run_id"].is_unique
    # the same records given again (a job folder, the merged file) are still counted once
    job = next(kernels.glob("0_*"))
    assert len(load_records([kernels, job, kernels / RECORDS_FILE])) == 16


def test_one_path_as_a_string_or_a_path_is_one_input(sweeps):
    """A notebook's ``load_records('outputs/sweeps/...')`` once iterated the string's characters."""
    kernels, _ = sweeps
    assert len(load_records(str(kernels))) == len(load_records(kernels)) == 16
    assert len(load_records(str(kernels / RECORDS_FILE))) == 16


def test_a_sweeps_records_files_are_its_jobs_not_the_merged_copy(sweeps):
    kernels, _ = sweeps
    jobs = sorted(kernels.glob(f"*_*/{RECORDS_FILE}"))
    assert len(jobs) == 4
    assert record_files(kernels) == jobs
    assert record_files(jobs[0].parent) == [jobs[0]]


def test_two_sweeps_merge_and_series_name_kernels_or_strategies(sweeps):
    frame = load_records(list(sweeps))
    assert len(frame) == 16 + 6
    assert set(frame["series"]) == {"sdpa", "ranges", "ring/ranges", "ulysses/ranges"}
    cp_rows = frame[frame["cp"] != "none"]
    assert set(cp_rows["series"]) == {"ring/ranges", "ulysses/ranges"}
    assert (frame["variant"] == "").all()  # nothing to tell apart here


def test_a_records_file_or_a_run_folder_is_an_input_too(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_records(run / RECORDS_FILE, [measured("sdpa", "causal", s) for s in LENGTHS])
    assert len(load_records([run])) == 4
    assert len(load_records([run / RECORDS_FILE])) == 4


def test_records_of_one_file_are_all_kept_even_without_identity(tmp_path):
    records = [measured("sdpa", "causal", 1024, dtype=d) for d in ("float32", "bfloat16")]
    for record in records:
        record.run_id, record.created_at = "", ""  # as hand-made records may leave them
    write_records(tmp_path / RECORDS_FILE, records)
    frame = load_records([tmp_path / RECORDS_FILE, tmp_path])  # the same file twice
    assert sorted(frame["dtype"]) == ["bfloat16", "float32"]


def test_a_run_of_only_ok_records_gets_its_band(tmp_path):
    # no failure anywhere: every number column keeps its integer dtype (no NaN)
    write_records(tmp_path / RECORDS_FILE, [measured("sdpa", "causal", s) for s in LENGTHS])
    figures = build_figures(load_records([tmp_path]))
    (line,) = line_figure(figures, "throughput_causal").panels[0].lines
    assert line.low is not None and line.high is not None
    for low, y, high in zip(line.low, line.y, line.high, strict=True):
        assert low < y < high


def test_rows_at_the_same_point_are_told_apart_by_the_setting_that_differs(tmp_path):
    a = [measured("sdpa", "causal", 1024, sweep="a", dtype="float32")]
    b = [measured("sdpa", "causal", 1024, sweep="b", dtype="bfloat16")]
    write_records(tmp_path / "a.jsonl", a)
    write_records(tmp_path / "b.jsonl", b)
    frame = load_records([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert sorted(variant_labels(frame)) == ["dtype=bfloat16", "dtype=float32"]


# ------------------------------------------------------------------------------------ figures
def test_throughput_line_is_the_records_tflops_and_the_band_their_p20_p80(figures):
    figure = line_figure(figures, "throughput_causal")
    forward, backward = figure.panels
    for panel, pass_ in ((forward, "fwd"), (backward, "bwd")):
        for line in panel.lines:
            kernel = line.series.split("/")[-1]
            cp = line.series.split("/")[0] if "/" in line.series else "none"
            expected = [
                r
                for r in all_records()
                if r.kernel == kernel
                and r.cp == cp
                and r.mask == "causal"
                and r.pass_result(pass_).status == "ok"
                and (cp == "none" or line.label.endswith(f"×{r.world_size}"))
            ]
            assert line.x == tuple(float(r.seqlen) for r in expected)
            assert line.y == tuple(r.pass_result(pass_).tflops for r in expected)
            # by hand: TFLOP/s = flops / (world x ms x 1e9); the p80 time is the slow end
            for r, low, high in zip(expected, line.low, line.high, strict=True):
                p = r.pass_result(pass_)
                assert low == pytest.approx(p.flops / (r.world_size * p.ms_p80 * 1e9), rel=1e-12)
                assert high == pytest.approx(p.flops / (r.world_size * p.ms_p20 * 1e9), rel=1e-12)
                assert low < p.tflops < high


def test_cp_throughput_is_per_device(figures):
    (ring4,) = [
        line
        for line in line_figure(figures, "throughput_causal").panels[0].lines
        if line.label == "ring/ranges ×4"
    ]
    record = measured("ranges", "causal", 1024, cp="ring", world=4, ms=1024 / 50)
    assert ring4.y[0] == pytest.approx(record.fwd.flops / (4 * record.fwd.ms_p50 * 1e9))


def test_failed_lengths_are_failed_points_with_their_status_and_reason(figures):
    forward, backward = line_figure(figures, "throughput_causal").panels
    fwd_failed = {(p.series, p.x, p.status) for p in forward.failed}
    assert fwd_failed == {("sdpa", 8192.0, "oom"), ("ulysses/ranges", 2048.0, "error")}
    assert {p.reason for p in forward.failed} == {
        "S = 8K, world size 1: CUDA out of memory",
        "S = 2K, world size 2: boom",
    }
    assert all(p.y == 0 for p in forward.failed)  # on the floor of the linear axis
    assert {(p.series, p.x, p.status) for p in backward.failed} == {
        ("sdpa", 8192.0, "skipped"),
        ("ulysses/ranges", 2048.0, "skipped"),
    }
    (sdpa,) = [line for line in forward.lines if line.series == "sdpa"]
    assert 8192.0 not in sdpa.x
    # on a log axis failed points sit below every value
    memory = line_figure(figures, "memory_causal").panels[0]
    lowest = min(y for line in memory.lines for y in line.y)
    assert memory.failed and all(0 < p.y < lowest for p in memory.failed)


def test_one_colour_per_series_in_every_figure_and_both_renderers(figures):
    expected = palette(["sdpa", "ranges", "ring/ranges", "ulysses/ranges"])
    assert figures.colours == expected
    assert len(set(expected.values())) == 4
    seen: dict[str, set[str]] = {}
    for figure in figures.figures:
        if isinstance(figure, LineFigure):
            for panel in figure.panels:
                for line in panel.lines:
                    seen.setdefault(line.series, set()).add(line.colour)
                for point in panel.failed:
                    seen.setdefault(point.series, set()).add(point.colour)
    assert {series: {c} for series, c in expected.items()} == seen
    from matplotlib.colors import to_hex

    figure = line_figure(figures, "throughput_causal")
    by_label = {line.label: line.series for line in figure.panels[0].lines}
    png_lines = [a for a in draw(figure).axes[0].get_lines() if a.get_label() in by_label]
    assert len(png_lines) == len(by_label)
    for artist in png_lines:
        assert to_hex(artist.get_color()) == expected[by_label[artist.get_label()]]
    html_lines = [t for t in to_plotly(figure).data if t.name in by_label]
    assert {t.name for t in html_lines} == set(by_label)
    for trace in html_lines:
        assert trace.line.color == expected[by_label[trace.name]]


def test_scaling_is_at_the_largest_length_every_strategy_ran(figures):
    figure = line_figure(figures, "scaling_causal")
    assert "S = 2K" in figure.title
    forward = figure.panels[0]
    (ring,) = [line for line in forward.lines if line.series == "ring/ranges"]
    assert ring.x == (2.0, 4.0)
    ulysses_failures = [(p.x, p.status) for p in forward.failed if p.series == "ulysses/ranges"]
    assert ulysses_failures == [(2.0, "error")]


def test_numerics_figure_has_the_tolerance_and_cp_figure_comm_bytes(figures):
    numerics = line_figure(figures, "numerics_document")
    assert [ref.y for ref in numerics.panels[0].refs] == [1e-3]
    cp = line_figure(figures, "cp_causal")
    imbalance, comm = cp.panels
    (ring2,) = [line for line in imbalance.lines if line.label == "ring/ranges ×2"]
    assert ring2.y == (1.02, 1.02)
    (sent,) = [line for line in comm.lines if line.label == "ring/ranges ×2"]
    (analytic,) = [line for line in comm.lines if line.label == "ring/ranges ×2 analytic"]
    assert sent.y == analytic.y == (1024 * 4096 * 2 / 2**20, 2048 * 4096 * 2 / 2**20)
    assert analytic.markers_only and not analytic.in_legend


def test_support_heatmap_colours_by_the_worst_status_and_counts(figures):
    (kernels,) = [f for f in figures.figures if f.name == "support_kernels"]
    assert isinstance(kernels, Heatmap)
    assert kernels.rows == ("ranges", "sdpa") and kernels.columns == ("causal", "document")
    sdpa = kernels.rows.index("sdpa")
    assert kernels.status[sdpa] == ("oom", "ok")
    assert kernels.text[sdpa][0] == "3 ok\n1 oom"
    (strategies,) = [f for f in figures.figures if f.name == "support_strategies"]
    assert isinstance(strategies, Heatmap)
    assert strategies.rows == ("ring/ranges", "ulysses/ranges")


def test_lines_covered_by_later_equal_lines_are_marked_to_draw_wider():
    def line(label: str, y: tuple[float, ...]) -> Line:
        return Line(label, label, "#000000", "solid", (1024.0, 2048.0), y)

    a, b, c, d = (
        line("a", (1.0, 2.0)),
        line("b", (1.0, 2.0)),
        line("c", (1.0, 3.0)),
        line("d", (1.0, 2.0)),
    )
    assert [x.under for x in stacked([a, b, c, d])] == [2, 1, 0, 0]


def test_log_ticks_label_narrow_and_wide_ranges():
    assert [label for _, label in log_ticks([210.0, 640.0])] == [
        "200",
        "300",
        "400",
        "500",
        "600",
        "800",
    ]
    assert [label for _, label in log_ticks([3e-8, 2e-3])] == [
        "1e-07",
        "1e-06",
        "1e-05",
        "0.0001",
        "0.001",
    ]
    assert log_ticks([1.0, 1.001]) == ()  # too narrow for any set of ticks: left to the renderer


def test_seqlen_labels():
    assert [seqlen_label(n) for n in (512, 1024, 8192, 131072, 1 << 20, 1536)] == [
        "512",
        "1K",
        "8K",
        "128K",
        "1M",
        "1.5K",
    ]


def test_reasons_are_grouped_with_counts(sweeps):
    table = reasons_table(load_records(list(sweeps)))
    rows = {(r.status, r.reason): r for r in table.itertuples()}
    assert rows[("oom", "CUDA out of memory")].records == 1
    assert rows[("error", "boom")].where == "ulysses/ranges × causal"
    not_run = rows[("skipped", "not run: fwd failed")]
    assert not_run.records == 2 and not_run.passes == "bwd"
    assert list(table["status"])[:2] == ["error", "oom"]  # worst first


# ------------------------------------------------------------------------------------ files
def test_summary_csv_has_one_row_per_record_with_the_input_values(built):
    with open(built.folder / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    records = {r.run_id: r for r in all_records()}
    assert sorted(row["run_id"] for row in rows) == sorted(records)
    for row in rows:
        record = records[row["run_id"]]
        assert (row["kernel"], row["cp"], row["mask"]) == (record.kernel, record.cp, record.mask)
        assert int(row["seqlen"]) == record.seqlen and row["status"] == record.status
        for pass_ in ("fwd", "bwd"):
            result = record.pass_result(pass_)
            for field, value in (
                ("ms_p50", result.ms_p50),
                ("tflops", result.tflops),
                ("mem_peak_mib", result.mem_peak_mib),
                ("max_abs_err", result.max_abs_err),
            ):
                text = row[f"{pass_}_{field}"]
                assert (float(text) if text else None) == value, (pass_, field)
    md = (built.folder / "summary.md").read_text()
    assert md.count("\n") == len(rows) + 2  # header, rule, one line per record


def test_every_figure_is_a_valid_png(built):
    pngs = sorted(built.png_dir.glob("*.png"))
    assert [p.stem for p in pngs] == sorted(built.figures)
    for path in pngs:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 600 and height > 300


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.refs.append((tag, name, value))


def test_the_page_is_self_contained_with_plotly_inlined_once(built):
    page = built.index.read_text()
    parser = _Refs()
    parser.feed(page)
    external = [r for r in parser.refs if r[2].startswith(("http://", "https://", "//"))]
    assert external == []
    assert not [r for r in parser.refs if r[0] == "script"]  # no script is loaded from a file
    assert page.count(plotly_js()[:500]) == 1
    assert page.count("Plotly.newPlot(") == len(built.figures)
    for name in built.figures:
        assert f'id="plot-{name}"' in page
    assert "Reasons" in page and "CUDA out of memory" in page


def test_expected_figures_are_drawn(built):
    assert set(built.figures) == {
        "support_kernels",
        "support_strategies",
        "throughput_causal",
        "throughput_document",
        "scaling_causal",
        "memory_causal",
        "memory_document",
        "numerics_causal",
        "numerics_document",
        "cp_causal",
    }
    assert built.omitted == []
    assert built.folder == built.index.parent and built.folder.name == "report"


def test_without_cp_records_the_page_says_why_the_cp_figures_are_missing(sweeps, tmp_path, capsys):
    kernels, _ = sweeps
    out = tmp_path / "out"
    assert main(["build", str(kernels / RECORDS_FILE), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"page: {out / 'index.html'}" in printed and f"PNGs: {out / 'png'}" in printed
    assert "not drawn: scaling: no CP records" in printed
    page = (out / "index.html").read_text()
    assert "Not drawn: no CP records (cp != none)." in page
    assert not list((out / "png").glob("scaling_*"))


def test_a_records_file_given_first_writes_the_report_next_to_it(tmp_path):
    write_records(tmp_path / RECORDS_FILE, [measured("sdpa", "causal", s) for s in LENGTHS])
    report = build_report([tmp_path / RECORDS_FILE])
    assert report.index == tmp_path / "report" / "index.html" and report.index.exists()


# ------------------------------------------------------------------------------------ bad input
def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    (empty_folder / "notes.txt").write_text("no records here")
    empty_file = tmp_path / "blank" / RECORDS_FILE
    empty_file.parent.mkdir()
    empty_file.write_text("\n")
    corrupt = tmp_path / "corrupt" / RECORDS_FILE
    corrupt.parent.mkdir()
    corrupt.write_text(json.dumps(measured("sdpa", "causal", 1024).to_dict()) + "\n{oops\n")
    return {
        "missing": (tmp_path / "nowhere", "no such file or folder"),
        "no records file": (empty_folder, "no records.jsonl"),
        "empty records file": (empty_file, "hold no records"),
        "corrupt line": (corrupt, ":2:"),
    }


@pytest.mark.parametrize(
    "case", ["missing", "no records file", "empty records file", "corrupt line"]
)
def test_bad_input_exits_2_naming_the_path_and_writes_nothing(tmp_path, capsys, case):
    path, words = _bad_files(tmp_path)[case]
    out = tmp_path / "out"
    good = tmp_path / "good"
    good.mkdir()
    write_records(good / RECORDS_FILE, [measured("sdpa", "causal", 1024)])
    assert main(["build", str(good), str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and words in err
    assert not out.exists() and not (good / "report").exists()


def test_no_path_at_all_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["build"])
    assert exit_.value.code == 2
    assert "PATH" in capsys.readouterr().err


def test_a_series_keeps_its_colour_across_reports_and_colours_stay_distinct():
    alone = palette(["ranges"])["ranges"]
    mixed = palette(["flex", "ranges", "sdpa", "ring/ranges", "ulysses/ranges", "mine"])
    assert mixed["ranges"] == alone == palette(["ranges", "sdpa"])["ranges"]
    assert mixed["ring/ranges"] == palette(["ring/sdpa"])["ring/sdpa"]  # by strategy
    assert len(set(mixed.values())) == len(mixed)  # distinct, unknown names included
    many = palette([f"kernel{i}" for i in range(len(SERIES_COLOURS) + 3)])
    assert len(set(many.values())) == len(SERIES_COLOURS)  # cycling once every colour is used


def test_every_registered_kernel_and_strategy_has_a_colour_slot_of_its_own():
    from lcab.cp import STRATEGIES
    from lcab.kernels import list_kernels

    known = [*list_kernels(), *(f"{cp}/ranges" for cp in STRATEGIES.names())]
    together = palette(known)
    assert all(palette([name])[name] == together[name] for name in known)


def test_figure_titles_say_what_the_numbers_ran_on(tmp_path):
    import pandas as pd

    from lcab.report.plot_style import hardware_label

    one = pd.DataFrame(
        {"dtype": ["float32"] * 2, "device": ["cpu"] * 2, "device_name": ["EPYC"] * 2}
    )
    assert hardware_label(one) == "float32 on EPYC (cpu)"
    mixed = pd.DataFrame(
        {"dtype": ["bfloat16", "float16"], "device": ["cuda", "cpu"], "device_name": ["H100", ""]}
    )
    assert hardware_label(mixed) == "2 dtypes on 2 device types"
    assert hardware_label(pd.DataFrame({"dtype": [""], "device": [""], "device_name": [""]})) == ""
    record = measured("ranges", "causal", 1024)
    record.device, record.device_name = "cpu", "EPYC"
    write_records(tmp_path / RECORDS_FILE, [record])
    figures = build_figures(load_records([tmp_path / RECORDS_FILE]))
    assert line_figure(figures, "throughput_causal").title.endswith("· float32 on EPYC (cpu)")


def test_two_named_runs_are_labelled_by_name_and_compared(tmp_path):
    """``build baseline=A new=B``: rows say which run, and the page compares the second run with
    the first (by hand: half the time is a ratio of 0.5; p20-p80 band 4.5/12 to 6/9)."""
    base = write_sweep(tmp_path / "a", [[measured("ranges", "causal", 1024, ms=10.0)]])
    new = write_sweep(tmp_path / "b", [[measured("ranges", "causal", 1024, ms=5.0, sweep="b")]])
    frame = load_records([f"baseline={base}", f"new={new}"])
    assert sorted(frame["variant"]) == ["run=baseline", "run=new"]
    built = build_report([f"baseline={base}", f"new={new}"], out=tmp_path / "report")
    assert (
        "| ranges causal 1K | fwd | 10 ms | 5 ms | 0.500 | (0.375–0.667) | faster |"
        in (built.folder / "compare.md").read_text()
    )
    assert "compare_new_causal" in built.figures
    page = built.index.read_text()
    assert '<section id="compare"><h2>Compared with the baseline</h2>' in page
    alone = build_report([base], out=tmp_path / "report")  # no named runs: no comparison left
    assert not (alone.folder / "compare.md").exists()
    assert 'id="compare"' not in alone.index.read_text()


def test_a_report_with_nothing_to_explain_says_so(tmp_path):
    sweep = write_sweep(tmp_path / "a", [[measured("ranges", "causal", 1024)]])
    built = build_report([sweep], out=tmp_path / "report")
    assert (built.folder / "reasons.md").read_text().startswith("Every pass of every record ran")
    header = (built.folder / "summary.md").read_text().splitlines()[0]
    assert "variant" in header and "reason" in header  # kept, if empty
