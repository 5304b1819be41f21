"""How the SLURM launcher collects a job that ended: no cluster needed (a stand-in job handle).

submitit waits up to 15 s for each task's result file once sacct says a job ended (a shared file
system may show it late). The launcher skips that wait only where a result file could not
change the records it writes; everywhere else it still waits.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from submitit.core.utils import UncompletedJobError

from lcab.bench.results import base_record
from lcab.bench.scheduled import FAILURE_FILE
from lcab.cell import Cell, JobInfo
from lcab.config import resolve_cell
from lcab.launch.outcome import JobEnd, result_can_change
from lcab.launch.shape import SlurmSettings, job_shape
from lcab.launch.slurm_launcher import PlannedJob, ShapedSlurmLauncher
from lcab.records.sinks import RECORDS_FILE, JsonlSink, read_records


@pytest.fixture
def cell(compose, tmp_path) -> Cell:
    lengths = "seqlen.values=[1024,2048,4096]"
    cfg = compose(["kernel=ranges", "cp=ring", "topology=2x2", lengths, "problem.device=cpu"])
    return resolve_cell(cfg, JobInfo(output_dir=str(tmp_path), run_id="s-0", sweep_id="s"))


class _EndedJob:
    """A submitit job handle whose job ended as ``state`` with no task's result file written."""

    job_id = "41"

    def __init__(self, folder: Path, state: str, srun_log: str = "") -> None:
        self.state = state
        self.results_called = False
        tasks = [folder / f"41_{t}_result.pkl" for t in range(4)]
        self._sub_jobs = [SimpleNamespace(paths=SimpleNamespace(result_pickle=p)) for p in tasks]
        self.paths = SimpleNamespace(stderr=folder / "41_0_log.err")
        self.paths.stderr.write_text(srun_log)

    def wait(self) -> None:
        """sacct says the job ended (the stand-in ended before it was collected)."""

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return {"State": self.state}

    @property
    def watcher(self) -> SimpleNamespace:
        """submitit's view: a job in a state it still waits on has not ended."""
        waiting = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "PREEMPTED", "UNKNOWN")
        return SimpleNamespace(is_done=lambda job_id, mode: self.state.split()[0] not in waiting)

    def results(self) -> list[object]:
        self.results_called = True  # submitit's wait for the result files, then its error
        raise UncompletedJobError(
            f"Job 41 (task: 0) has not produced any output (state: {self.state})"
        )


def _collect(cell: Cell, handle: _EndedJob) -> list[dict]:
    launcher = object.__new__(ShapedSlurmLauncher)  # _collect reads nothing of the launcher's
    planned = PlannedJob(0, [], cell, job_shape(cell, SlurmSettings()), settled=False)
    launcher._collect(planned, handle)
    return [r.to_dict() for r in read_records(Path(cell.job.output_dir) / RECORDS_FILE)]


def test_a_job_the_scheduler_ended_is_settled_without_waiting_for_result_files(cell, tmp_path):
    (tmp_path / "log").mkdir()
    handle = _EndedJob(tmp_path / "log", "CANCELLED by 0")
    records = _collect(cell, handle)
    assert not handle.results_called
    assert [r["status"] for r in records] == ["error", "skipped", "skipped"]
    assert "SLURM job 41 ended CANCELLED" in records[0]["reasons"][0]


def test_a_rank_s_failure_report_is_the_reason_without_waiting_for_result_files(cell, tmp_path):
    (tmp_path / "log").mkdir()
    failure = {"rank": 0, "host": "n1", "seqlen": 2048, "status": "timeout", "error": "time limit"}
    (tmp_path / FAILURE_FILE.format(rank=0)).write_text(json.dumps(failure))
    first = base_record(cell, 1024, {})
    first.status = "ok"
    JsonlSink(tmp_path / RECORDS_FILE).write(first)
    handle = _EndedJob(tmp_path / "log", "FAILED")
    records = _collect(cell, handle)
    assert not handle.results_called
    assert [r["status"] for r in records] == ["ok", "timeout", "skipped"]
    assert "rank 0 on n1 failed at seqlen 2048: time limit" in records[1]["reasons"][0]


def test_a_job_that_left_nothing_to_explain_its_end_still_waits_for_its_result(cell, tmp_path):
    (tmp_path / "log").mkdir()
    handle = _EndedJob(tmp_path / "log", "FAILED")
    records = _collect(cell, handle)
    assert handle.results_called  # the result file is the one account left: worth the wait
    assert [r["status"] for r in records] == ["error", "skipped", "skipped"]
    assert "has not produced any output" in records[0]["reasons"][0]


def test_a_result_cannot_change_a_cell_whose_every_length_is_recorded(cell, tmp_path):
    sink = JsonlSink(tmp_path / RECORDS_FILE)
    for seqlen in cell.seqlens[:-1]:
        sink.write(base_record(cell, seqlen, {}))
    assert result_can_change(cell, JobEnd("41", "FAILED"))
    assert result_can_change(cell, JobEnd("41", "COMPLETED"))
    killed = "srun: error: n2: task 3: Killed"
    assert not result_can_change(cell, JobEnd("41", "FAILED", srun_log=killed))
    sink.write(base_record(cell, cell.seqlens[-1], {}))
    assert not result_can_change(cell, JobEnd("41", "FAILED"))
    assert not result_can_change(cell, JobEnd("41", "COMPLETED"))


def test_a_job_sacct_still_shows_running_waits_for_its_result_files(cell, tmp_path):
    sink = JsonlSink(tmp_path / RECORDS_FILE)
    for seqlen in cell.seqlens:
        sink.write(base_record(cell, seqlen, {}))
    (tmp_path / "log").mkdir()
    handle = _EndedJob(tmp_path / "log", "RUNNING")  # a task's result, sacct not caught up
    _collect(cell, handle)
    assert handle.results_called
