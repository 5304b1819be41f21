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
