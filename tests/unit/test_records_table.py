"""The results table reads in the machine's units, keeps long notes out of its rows and fits
the terminal (120 columns where there is none).

A newcomer's first CPU run printed "0.00525 TFLOP/s" and "1.23e+03 ms"; reasons and warnings
inside the rows wrapped each over 7-8 lines at 120 columns; a sweep ended with one table per
cell and a one-column summary. Expectations here are computed by hand from the records given.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from lcab.records.schema import RunRecord
from lcab.records.sinks import RECORDS_FILE, merge_records, write_records
from lcab.records.summary import print_sweep_summary
from lcab.records.table import WIDTH_OFF_TERMINAL, console, duration, print_table, records_table
from tests.helpers.synthetic_records import failed, measured


def _cpu(record: RunRecord) -> RunRecord:
    record.device = "cpu"
    return record


def test_cpu_records_read_in_gflops_and_gpu_ones_in_tflops():
    cpu = [_cpu(measured("ranges", "causal", 1024, ms=10.0))]
    table, _ = records_table(cpu)
    headers = [c.header for c in table.columns]
    assert "fwd GFLOP/s" in headers and "fwd time" in headers
    expected = cpu[0].fwd.tflops * 1000  # by hand: the same throughput, in GFLOP/s
    assert list(table.columns[headers.index("fwd GFLOP/s")].cells) == [f"{expected:.3g}"]
    gpu = [measured("ranges", "causal", 1024, ms=10.0)]
    gpu[0].device = "cuda"
    assert "fwd TFLOP/s" in [c.header for c in records_table(gpu)[0].columns]


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
    assert f"[1] fwd: {reason}" in text
    rows = [line for line in text.splitlines() if line.startswith("│ fa3")]
    assert len(rows) == 2 and all(row.rstrip(" │").endswith("[1]") for row in rows)


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
    rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
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
    assert "lcab results: kernel ranges, mask block_causal_document" in text
    headers = [c.header for c in records_table(records)[0].columns]
    assert "kernel" not in headers and "mask" not in headers and "cp" in headers
    assert "ring_allgather" in text and "…" not in text
    assert all(len(line) <= WIDTH_OFF_TERMINAL for line in text.splitlines())
    one, _ = records_table(records[:1])  # one row: its own columns, the title as given
    assert [c.header for c in one.columns][:3] == ["kernel", "cp", "mask"]
