"""The results table reads in the machine's units, keeps long notes out of its rows and fits
the terminal (120 columns where there is none) without cutting or wrapping an identifier.

A newcomer's first CPU run printed "0.00525 TFLOP/s" and "1.23e+03 ms"; reasons and warnings
inside the rows wrapped each over 7-8 lines at 120 columns; a sweep ended with one table per
cell and a one-column summary; the design card's sweep then squeezed kernel, cp and mask into
2-character columns (``│ fa │ ul │ ca │``) wrapped over 6-8 lines; only a record's first reason
reached the notes; a busy host gave every length its own 3-line footnote. Expectations here
are computed by hand from the records given; rows are read back from the printed text
(`tests.helpers.table_text`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from lcab.plan.record_prediction import attach
from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, merge_records, write_records
from lcab.records.summary import print_sweep_summary
from lcab.records.table import (
    WIDTH_OFF_TERMINAL,
    console,
    duration,
    print_table,
    record_line,
    records_table,
)
from tests.helpers.synthetic_records import failed, measured
from tests.helpers.table_text import expected_keys, printed_rows, row_keys


def _cpu(record: RunRecord) -> RunRecord:
    record.device = "cpu"
    return record


def test_cpu_records_read_in_gflops_and_gpu_ones_in_tflops():
    cpu = [_cpu(measured("ranges", "causal", 1024, ms=10.0))]
    table, _ = records_table(cpu)
    headers = [c.header for c in table.columns]
    assert "fwd\nGFLOP/s" in headers and "fwd\ntime" in headers
    expected = cpu[0].fwd.tflops * 1000  # by hand: the same throughput, in GFLOP/s
    assert list(table.columns[headers.index("fwd\nGFLOP/s")].cells) == [f"{expected:.3g}"]
    gpu = [measured("ranges", "causal", 1024, ms=10.0)]
    gpu[0].device = "cuda"
    assert "fwd\nTFLOP/s" in [c.header for c in records_table(gpu)[0].columns]


def test_times_read_as_people_read_them():
    assert (duration(4.006), duration(1234.0), duration(0.005), duration(None)) == (
        "4.01 ms", "1.23 s", "5 us", "-",
    )  # fmt: skip


def test_long_notes_are_numbered_once_and_printed_under_the_table():
    reason = "kernel fa3: needs a CUDA GPU; needs package 'flash_attn_interface', not installed"
    records = [failed("fa3", "causal", s, "skipped", reason) for s in (1024, 2048)]
    records.append(_cpu(measured("ranges", "causal", 1024)))
    out = Console(record=True, width=WIDTH_OFF_TERMINAL)
    print_table(records, out=out)
    text = out.export_text()
    assert all(len(line) <= WIDTH_OFF_TERMINAL for line in text.splitlines())
    assert text.count(reason) == 1  # once, under the table
    assert f"[1] fwd: {reason}" in text and "[2] bwd: not run: fwd failed" in text
    rows = [line for line in text.splitlines() if line.startswith(" fa3 ")]
    assert len(rows) == 2 and all(row.rstrip().endswith("[1,2]") for row in rows)
    assert row_keys(printed_rows(text)) == expected_keys(records)


def test_off_a_terminal_the_table_takes_120_columns():
    assert not console().is_terminal  # pytest captures the output
    assert console().width == WIDTH_OFF_TERMINAL == 120


def test_a_sweep_ends_with_one_table_of_every_cell(tmp_path: Path):
    jobs = {
        "0_kernel=ranges": [_cpu(measured("ranges", "causal", s)) for s in (1024, 2048)],
        "1_kernel=sdpa": [_cpu(measured("sdpa", "causal", 1024, job=1))],
    }
    for name, records in jobs.items():
        (tmp_path / name).mkdir()
        write_records(tmp_path / name / RECORDS_FILE, records)
    merged, csv, _ = merge_records(tmp_path)
    out = Console(record=True, width=WIDTH_OFF_TERMINAL)
    print_sweep_summary(tmp_path, merged, csv, console=out)
    text = out.export_text()
    rows = [row["kernel"] for row in printed_rows(text)]
    assert rows == ["ranges", "ranges", "sdpa"]  # every record, in job order, one table
    assert f"sweep {tmp_path.name}: 2 cells, 3 records" in text


def test_what_every_row_shares_is_said_once_and_no_value_is_cut():
    """A CP sweep's rows share kernel and mask: the title says them; long names are not cut."""
    records = []
    for cp in ("ring_allgather", "loongtrain"):
        record = _cpu(measured("ranges", "block_causal_document", 1024))
        record.cp, record.world_size = cp, 4
        records.append(record)
    out = Console(record=True, width=WIDTH_OFF_TERMINAL)
    print_table(records, out=out)
    text = out.export_text()
    assert "lcab results: kernel=ranges, mask=block_causal_document" in text
    headers = [c.header for c in records_table(records)[0].columns]
    assert "kernel" not in headers and "mask" not in headers and "cp" in headers
    assert "ring_allgather" in text and "…" not in text
    assert all(len(line) <= WIDTH_OFF_TERMINAL for line in text.splitlines())
    one, _ = records_table(records[:1], "run")  # one row: one cell, said in the title
    assert one.title == "run: kernel=ranges, cp=ring_allgather, mask=block_causal_document"
    job, _ = records_table(records[:1], "cp=ring_allgather,kernel=ranges")  # a job's overrides
    assert job.title == "cp=ring_allgather,kernel=ranges: mask=block_causal_document"


FA3_REASON = (
    "kernel fa3: needs a CUDA GPU (none is visible on this machine); kernel fa3: dtype float32 "
    "unsupported (bfloat16, float16); kernel fa3: needs package 'flash_attn_interface', not "
    "installed (pip install flash-attn-3 (built from the flash-attention repo's hopper/ directory))"
)
LENGTHS = (1024, 2048, 4096, 8192)


def _cp_measured(kernel: str, cp: str, mask: str, seqlen: int, job: int) -> RunRecord:
    """A CPU record as a 4-rank cell writes it: planned, with the clock and share of the peak."""
    record = _cpu(measured(kernel, mask, seqlen, cp=cp, world=4, job=job, ms=seqlen / 50))
    record.predicted_hardware = "cpu_gloo_local@auto"
    for p, ratio in (("fwd", 0.93), ("bwd", 1.25)):
        res = record.pass_result(p)
        res.predicted_ratio, res.clock_mhz_median, res.peak_share = ratio, 2445.0, 0.0968
    return record


def _design_card() -> list[list[RunRecord]]:
    """`-m kernel=fa3,sparse cp=ulysses,ring mask=causal,document` on a CPU: fa3 skipped."""
    jobs = []
    for kernel in ("fa3", "sparse"):
        for cp in ("ulysses", "ring"):
            for mask in ("causal", "causal_document"):
                job = len(jobs)
                if kernel == "fa3":
                    why = FA3_REASON
                    records = [
                        _cpu(failed(kernel, mask, s, "skipped", why, cp=cp, world=4, job=job))
                        for s in LENGTHS
                    ]
                else:
                    records = [_cp_measured(kernel, cp, mask, s, job) for s in LENGTHS]
                jobs.append(records)
    return jobs


def _printed_at_120_in_a_pipe(text: str, records: list[RunRecord]) -> None:
    """Every line within 120 columns, nothing cut, every record's row whole and findable."""
    assert max(len(line) for line in text.splitlines()) <= WIDTH_OFF_TERMINAL, text
    assert "…" not in text
    assert row_keys(printed_rows(text)) == expected_keys(records), text


def test_the_design_card_sweep_reads_at_120_columns_in_a_pipe(tmp_path: Path, capsys):
    jobs = _design_card()
    for number, records in enumerate(jobs):
        folder = tmp_path / f"{number}_job"
        folder.mkdir()
        write_records(folder / RECORDS_FILE, records)
    merged, csv, _ = merge_records(tmp_path)
    print_sweep_summary(tmp_path, merged, csv)  # the console of a pipe: 120 columns
    text = capsys.readouterr().out
    _printed_at_120_in_a_pipe(text, [r for records in jobs for r in records])
    assert " ".join(text.split()).count(f"] fwd: {FA3_REASON}") == 1  # one note, 16 rows


@pytest.mark.parametrize(
    ("cps", "masks", "lengths"),
    [
        (("ulysses", "ring", "ring_allgather", "usp", "loongtrain"), ("causal_document",), (4096,)),
        (
            ("ulysses", "ring", "ring_allgather", "usp", "loongtrain"),
            ("causal", "causal_document", "share_question"),
            LENGTHS,
        ),
    ],
)
def test_a_cp_sweep_reads_at_120_columns_in_a_pipe(cps, masks, lengths, capsys):
    """The README's CP command (one table) and ``+sweep=cp_strategies`` (split to fit)."""
    records = [
        _cp_measured("ranges", cp, mask, s, job)
        for job, (cp, mask) in enumerate((c, m) for c in cps for m in masks)
        for s in lengths
    ]
    print_table(records, "sweep")
    text = capsys.readouterr().out
    _printed_at_120_in_a_pipe(text, records)
    tables = sum(1 for line in text.splitlines() if set(line.strip()) == {"─"})
    assert tables == (1 if len(masks) == 1 else len(cps))


def test_every_reason_reaches_the_notes():
    """A pass skipped beside one that ran, the same reason for two passes, a traceback."""
    flex = _cpu(measured("flex", "causal", 1024))
    flex.bwd.status, flex.bwd.reason = "skipped", "PyTorch's FlexAttention has no backward on CPU"
    flex.reasons = [f"bwd: {flex.bwd.reason}"]
    flex.prediction_warning = "off the plan: fwd 0.2x (10 ms, 2 predicted)"
    both = _cpu(failed("sdpa", "causal", 1024, "skipped", "heads_q=8 is not divisible by 6"))
    both.bwd.reason = both.fwd.reason
    both.reasons = [f"fwd: {both.fwd.reason}", f"bwd: {both.bwd.reason}"]
    crash = _cpu(failed("naive", "causal", 1024, "error", "x"))
    crash.reasons = ["Traceback (most recent call last):\n  File ...\nRuntimeError: boom"]
    crash.fwd.reason = crash.bwd.reason = None
    out = Console(record=True, width=WIDTH_OFF_TERMINAL)
    print_table([flex, both, crash], out=out)
    notes = [line for line in out.export_text().splitlines() if line.startswith("[")]
    assert notes == [
        "[1] bwd: PyTorch's FlexAttention has no backward on CPU",
        "[2] off the plan: fwd 0.2x (10 ms, 2 predicted)",
        "[3] fwd, bwd: heads_q=8 is not divisible by 6",
        "[4] RuntimeError: boom",
    ]
    assert record_line(flex).endswith(f"({flex.reasons[0]}; {flex.prediction_warning})")
    assert "(" not in record_line(flex, with_notes=False)


def _off_plan(seqlen: int, load: float, measured_ms: float) -> RunRecord:
    """A CPU record the planner predicted at 10 ms per pass, on a host at ``load`` (2 cores)."""
    record = _cpu(measured("ranges", "causal", seqlen, ms=measured_ms))
    record.host_cores, record.host_load_start, record.predicted_hardware = 2, load, "cpu@auto"
    prediction = SimpleNamespace(pass_=lambda name: SimpleNamespace(time_ms=10.0, tflops=1.0))
    attach(record, prediction)  # the planner's own warning
    return record


def test_a_busy_host_is_said_once_per_table_and_other_misses_keep_their_own_note():
    busy = [_off_plan(s, load, 40.0) for s, load in ((1024, 6.13), (2048, 10.38), (4096, 8.0))]
    quiet = _off_plan(8192, 0.2, 40.0)  # slow on an idle host: the load does not explain it
    fast = _off_plan(16384, 9.0, 2.0)  # faster than planned on a busy host: nor does it
    out = Console(record=True, width=WIDTH_OFF_TERMINAL)
    print_table([*busy, quiet, fast], out=out)
    text = out.export_text()
    flat = " ".join(text.split())  # the notes as one text, whatever their line breaks
    assert [line[:3] for line in text.splitlines() if line.startswith("[")] == ["[1]", "[2]", "[3]"]
    assert "[1] off the plan while the host was busy (load average 6.13-10.38 on 2 cores" in flat
    assert "[2] off the plan: fwd 0.25x (40 ms, 10 predicted); bwd 0.1x" in flat
    assert "[3] off the plan: fwd 5x (2 ms, 10 predicted)" in flat and "on cpu@auto" in flat
    assert "the host was busy: load average" not in text  # no length's own busy footnote
    marks = [line.split()[-1] for line in text.splitlines() if " ok " in line]
    assert marks == ["[1]", "[1]", "[1]", "[2]", "[3]"]
