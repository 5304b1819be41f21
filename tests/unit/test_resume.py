"""Resuming a job: which earlier records settle their length, and which lengths run again."""

from __future__ import annotations

import pytest

from lcab.records import JsonlSink, RunRecord, read_records
from lcab.records.resume import split_done
from lcab.records.sinks import write_records

CONFIG = {
    "kernel": {"name": "ranges", "block": 128},
    "seqlen": {"name": "short", "values": [1024, 2048, 4096], "per_device": False},
    "bench": {"reps": 5, "progress": True},
    "seed": 0,
    "logger": {"name": "none"},
    "study": "lcab",
    "resume": False,
}
LENGTHS = [1024, 2048, 4096]


def record(seqlen: int, status: str = "ok", reasons=(), config=None, run_id="") -> RunRecord:
    return RunRecord(
        seqlen=seqlen,
        status=status,
        reasons=list(reasons),
        config=CONFIG if config is None else config,
        run_id=run_id,
    )


def write(path, records) -> None:
    sink = JsonlSink(path)
    for r in records:
        sink.write(r)


def test_no_earlier_file_runs_every_length(tmp_path):
    kept, todo = split_done(tmp_path / "records.jsonl", LENGTHS, CONFIG)
    assert kept == [] and todo == LENGTHS


@pytest.mark.parametrize(
    ("status", "reasons", "is_kept"),
    [
        ("ok", [], True),
        ("numerics_mismatch", ["fwd: out max error 0.2 > 1e-3"], True),
        ("skipped", ["kernel 'fa3' needs a CUDA GPU"], True),
        ("skipped", ["not run: seqlen 1024 ended in timeout"], False),
        ("error", ["RuntimeError: boom"], False),
        ("timeout", ["no result within bench.timeout_s=5 s; ranks killed"], False),
        ("oom", ["rank 0 died of SIGKILL"], False),
    ],
)
def test_a_length_is_kept_only_when_its_record_settled_it(tmp_path, status, reasons, is_kept):
    path = tmp_path / "records.jsonl"
    write(path, [record(2048, status, reasons)])
    kept, todo = split_done(path, LENGTHS, CONFIG)
    assert [r.seqlen for r in kept] == ([2048] if is_kept else [])
    assert todo == ([1024, 4096] if is_kept else LENGTHS)


def test_records_of_another_configuration_are_stale(tmp_path):
    path = tmp_path / "records.jsonl"
    other_reps = {**CONFIG, "bench": {"reps": 7, "progress": True}}
    other_seed = {**CONFIG, "seed": 1}
    other_kernel = {**CONFIG, "kernel": {"name": "ranges", "block": 64}}
    write(path, [record(1024, config=other_reps), record(2048, config=other_seed)])
    write(path, [record(4096, config=other_kernel)])
    kept, todo = split_done(path, LENGTHS, CONFIG)
    assert kept == [] and todo == LENGTHS


def test_reporting_keys_and_the_length_list_do_not_make_a_record_stale(tmp_path):
    path = tmp_path / "records.jsonl"
    first_run = {
        **CONFIG,
        "logger": {"name": "wandb", "mode": "offline"},
        "study": "earlier",
        "bench": {"reps": 5, "progress": False},
        "seqlen": {"name": "short", "values": [1024], "per_device": False},
    }
    write(path, [record(1024, config=first_run)])
    kept, todo = split_done(path, LENGTHS, {**CONFIG, "resume": True})
    assert [r.seqlen for r in kept] == [1024] and todo == [2048, 4096]


def test_the_last_settled_record_of_a_length_wins_and_only_those_are_kept(tmp_path):
    path = tmp_path / "records.jsonl"
    write(
        path,
        [
            record(1024, run_id="first"),
            record(2048, "timeout", ["no result"]),
            record(1024, run_id="second"),
            record(4096, "skipped", ["not run: seqlen 2048 ended in timeout"]),
        ],
    )
    kept, todo = split_done(path, LENGTHS, CONFIG)
    assert [(r.seqlen, r.run_id) for r in kept] == [(1024, "second")]
    assert todo == [2048, 4096]
    write_records(path, kept)
    assert [(r.seqlen, r.run_id, r.status) for r in read_records(path)] == [(1024, "second", "ok")]


def test_a_torn_last_record_leaves_its_length_to_run_again(tmp_path):
    path = tmp_path / "records.jsonl"
    write(path, [record(1024)])
    cut = record(2048).to_json()
    with path.open("a") as fh:
        fh.write(cut[: len(cut) // 3])  # the job was killed while writing seqlen 2048
    kept, todo = split_done(path, LENGTHS, CONFIG)
    assert [r.seqlen for r in kept] == [1024] and todo == [2048, 4096]


def _frontier(statuses: list[tuple[int, str]], status: str = "ok") -> RunRecord:
    """A frontier search's record: the longest probe that ran, every probe listed."""
    fits = max((n for n, s in statuses if s == "ok"), default=statuses[-1][0])
    found = record(fits, status)
    found.frontier_probes = [{"seqlen": n, "status": s} for n, s in statuses]
    found.frontier_bracket = [fits, None]
    return found


@pytest.mark.parametrize(
    ("probes", "status", "is_kept"),
    [
        ([(1024, "ok"), (2048, "ok"), (4096, "oom"), (3072, "ok")], "ok", True),
        ([(1024, "oom"), (512, "oom")], "oom", True),  # nothing fits: a finished search too
        ([(1024, "ok"), (2048, "error")], "ok", False),  # stopped by an error: search again
    ],
)
def test_a_finished_frontier_search_settles_its_first_length(tmp_path, probes, status, is_kept):
    path = tmp_path / "records.jsonl"
    found = _frontier(probes, status)
    write(path, [found])
    kept, todo = split_done(path, [1024], CONFIG)
    assert todo == ([] if is_kept else [1024])
    assert [r.seqlen for r in kept] == ([found.seqlen] if is_kept else [])
