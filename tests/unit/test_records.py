"""RunRecord: schema round-trip, status combination, JSONL and CSV sinks, merging."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lcab.records import (
    SCHEMA_VERSION,
    JsonlSink,
    PassResult,
    RunRecord,
    merge_records,
    read_records,
)


def make_record(**kw) -> RunRecord:
    kw = {"kernel": "ranges", "mask": "causal", "seqlen": 1024, "passes": ["fwd", "bwd"], **kw}
    record = RunRecord(**kw)
    record.fwd = PassResult(status="ok", ms_p50=1.5, tflops=0.2, errors={"out": 1e-7})
    record.bwd = PassResult(status="skipped", reason="no backward")
    return record


def test_round_trip_preserves_every_field():
    record = make_record(reasons=["bwd: no backward"], doc_lengths=[3, 4], config={"a": {"b": 1}})
    again = RunRecord.from_dict(json.loads(record.to_json()))
    assert again == record
    assert isinstance(again.fwd, PassResult) and again.fwd.errors == {"out": 1e-7}


def test_unknown_schema_version_is_refused():
    data = make_record().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="schema_version"):
        RunRecord.from_dict(data)


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("ok", "ok"), "ok"),
        (("ok", "skipped"), "ok"),
        (("skipped", "skipped"), "skipped"),
        (("ok", "numerics_mismatch"), "numerics_mismatch"),
        (("oom", "ok"), "oom"),
        (("error", "oom"), "error"),
        (("timeout", "skipped"), "timeout"),
    ],
)
def test_status_combines_passes_by_severity(statuses, expected):
    record = RunRecord(passes=["fwd", "bwd"])
    record.fwd.status, record.bwd.status = statuses
    record.finalise_status()
    assert record.status == expected


def test_unrequested_passes_do_not_count():
    record = RunRecord(passes=["fwd"])
    record.fwd.status = "ok"
    record.bwd.status = "error"  # not requested
    record.finalise_status()
    assert record.status == "ok"


def test_jsonl_sink_appends_and_reads_back(tmp_path):
    sink = JsonlSink(tmp_path / "records.jsonl")
    first, second = make_record(), make_record(seqlen=2048)
    sink.write(first)
    sink.write(second)
    assert read_records(sink.path) == [first, second]


def test_read_records_names_the_bad_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(make_record().to_json() + "\n{not json\n")
    with pytest.raises(ValueError, match=r"records.jsonl:2"):
        read_records(path)


def test_merge_collects_every_job_and_writes_csv(tmp_path):
    for job in range(3):
        sink = JsonlSink(tmp_path / f"{job}_kernel=x" / "records.jsonl")
        for seqlen in (256, 512):
            sink.write(make_record(job_num=job, seqlen=seqlen))
    merged, csv, count = merge_records(tmp_path)
    assert count == 6
    records = read_records(merged)
    assert [(r.job_num, r.seqlen) for r in records] == [
        (j, s) for j in range(3) for s in (256, 512)
    ]
    frame = pd.read_csv(csv)
    assert len(frame) == 6
    assert {"fwd_ms_p50", "bwd_status", "kernel", "seqlen"} <= set(frame.columns)
    # merging again does not count the merged file itself
    assert merge_records(tmp_path)[2] == 6


def test_a_torn_last_line_is_skipped_with_one_line_and_the_rest_is_read(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    whole, cut = make_record(), make_record(seqlen=2048).to_json()
    path.write_text(whole.to_json() + "\n" + cut[: len(cut) // 2])  # killed mid-write
    assert read_records(path) == [whole]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torn" in err[0] and str(path) in err[0]
    assert path.read_text().endswith(cut[: len(cut) // 2])  # a reader never cuts the file


def test_a_whole_last_record_without_its_newline_counts_and_the_sink_adds_the_newline(tmp_path):
    path = tmp_path / "records.jsonl"
    first, second = make_record(), make_record(seqlen=2048)
    path.write_text(first.to_json())  # the newline alone is missing
    assert read_records(path) == [first]
    JsonlSink(path).write(second)
    assert read_records(path) == [first, second]
    assert not path.with_name("records.jsonl.torn").exists()


def test_the_sink_sets_a_torn_tail_aside_before_it_appends(tmp_path):
    path = tmp_path / "records.jsonl"
    first, again = make_record(), make_record(seqlen=2048)
    cut = again.to_json()[:100]
    path.write_text(first.to_json() + "\n" + cut)
    JsonlSink(path).write(again)
    assert read_records(path) == [first, again]
    assert path.read_text().count("\n") == 2  # whole lines only
    assert path.with_name("records.jsonl.torn").read_text() == cut + "\n"


_FILE_SIZE_LIMITED = """
import resource, signal, sys
from pathlib import Path
from lcab.records.sinks import JsonlSink, RecordWriteError, write_csv, read_records
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, not death
path = Path(sys.argv[1]) / "records.jsonl"
records = read_records(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
for target in ("jsonl", "csv"):
    try:
        if target == "jsonl":
            JsonlSink(path).write(records[0])
        else:
            write_csv(records * 20, path.with_name("records.csv"))
        print(target, "written")
    except RecordWriteError as err:
        print(target, "refused:", err.cause)
"""


def test_a_write_the_file_system_cuts_short_leaves_whole_lines_and_no_partial_csv(tmp_path):
    import subprocess
    import sys

    from tests.helpers.cli import cli_env

    path = tmp_path / "records.jsonl"
    first = make_record()
    JsonlSink(path).write(first)
    (tmp_path / "records.csv").write_text("old view\n")
    size = path.stat().st_size
    limit = size + len(first.to_json()) // 2  # room for half of the next line: a short write
    done = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMITED, str(tmp_path), str(limit)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "jsonl refused: File too large",
        "csv refused: File too large",
    ]
    assert path.stat().st_size == size and read_records(path) == [first]  # cut back
    assert (tmp_path / "records.csv").read_text() == "old view\n"  # the old view, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.csv", "records.jsonl"]
