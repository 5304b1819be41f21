"""The SLURM pieces that need no cluster: shapes, rank environment, failure attribution, records."""

from __future__ import annotations

import json
import math

import pytest

from lcab.bench.scheduled import FAILURE_FILE, RANK_FILE, classify
from lcab.cell import JobInfo
from lcab.config import resolve_cell
from lcab.distributed.context import scheduler_environment
from lcab.launch.outcome import JobEnd, killed_ranks, settle
from lcab.launch.shape import SlurmSettings, job_shape
from lcab.records.sinks import RECORDS_FILE, JsonlSink, read_records


@pytest.fixture
def cell_2x4(compose, tmp_path):
    cfg = compose(
        [
            "kernel=ranges",
            "cp=ring",
            "topology=2x4",
            "seqlen.values=[1024,2048,4096]",
            "bench.timeout_s=600",
            "problem.device=cpu",
        ]
    )
    return resolve_cell(cfg, JobInfo(output_dir=str(tmp_path), run_id="s-0", sweep_id="s"))


def test_shape_is_one_task_per_rank_with_a_limit_from_the_lengths(cell_2x4):
    shape = job_shape(
        cell_2x4,
        SlurmSettings(
            partition="gpu", gpus_per_task=1, cpus_per_task=6, mem_gb_per_task=40, startup_s=300
        ),
    )
    assert (shape.nodes, shape.tasks_per_node, shape.tasks) == (2, 4, 8)
    assert shape.gpus_per_node == 4 and shape.gpus == 8
    assert shape.mem_gb == 160 and shape.cpus_per_task == 6 and shape.partition == "gpu"
    assert shape.timeout_min == math.ceil((300 + 3 * 600) / 60) == 35
    assert shape.gpu_hours() == pytest.approx(8 * 35 / 60)
    params = shape.executor_parameters()
    assert params["nodes"] == 2 and params["tasks_per_node"] == 4
    assert params["gpus_per_node"] == 4 and params["slurm_partition"] == "gpu"


def test_a_fixed_time_limit_wins_and_cpu_jobs_ask_for_no_gpu(cell_2x4):
    shape = job_shape(cell_2x4, SlurmSettings(timeout_min=7))
    assert shape.timeout_min == 7 and shape.gpus_per_node == 0
    assert shape.executor_parameters()["gpus_per_node"] is None
    assert "mem_gb" not in shape.executor_parameters()


def test_ranks_and_rendezvous_come_from_slurm_and_torchrun_variables_win():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "123457",
        "SLURM_JOB_NODELIST": "gpu-[07-08]",
    }
    out = scheduler_environment(env)
    assert out["RANK"] == "5" and out["WORLD_SIZE"] == "8" and out["LOCAL_RANK"] == "1"
    assert out["LOCAL_WORLD_SIZE"] == "4"
    assert out["MASTER_PORT"] == str(20000 + 123457 % 20000)
    assert out["MASTER_ADDR"] in ("gpu-07",)  # scontrol absent here: the list's first host
    assert (
        scheduler_environment({**env, "RANK": "0", "MASTER_PORT": "29500"})
        .keys()
        .isdisjoint({"RANK", "MASTER_PORT"})
    )
    assert scheduler_environment({"RANK": "0", "WORLD_SIZE": "2"}) == {}


def test_jobs_sharing_a_node_get_different_ports():
    ports = {
        scheduler_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": str(j)})[
            "MASTER_PORT"
        ]
        for j in range(1000, 1100)
    }
    assert len(ports) == 100


def test_srun_messages_name_the_ranks_killed_by_a_signal():
    log = (
        "srun: error: n2: task 2: Exited with exit code 1\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=6.0\n"
        "srun: error: n2: task 3: Killed\n"
        "srun: error: n1: tasks 0-1,4: Segmentation fault\n"
    )
    assert killed_ranks(log) == [
        (3, "n2", "Killed"),
        (0, "n1", "Segmentation fault"),
        (1, "n1", "Segmentation fault"),
        (4, "n1", "Segmentation fault"),
    ]


def test_exceptions_map_to_statuses():
    assert classify(MemoryError()) == "oom"
    assert classify(RuntimeError("Timed out waiting 30000ms for recv")) == "timeout"
    assert classify(RuntimeError("Job not requeued because: timed-out too many times")) == "timeout"
    assert classify(ValueError("bad shape")) == "error"


def _write_failure(folder, rank, host, seqlen, status, error):
    failure = {"rank": rank, "host": host, "seqlen": seqlen, "status": status, "error": error}
    (folder / FAILURE_FILE.format(rank=rank)).write_text(json.dumps(failure))


def test_settle_writes_one_record_per_unsettled_length_blaming_the_silent_rank(cell_2x4, tmp_path):
    sink = JsonlSink(tmp_path / RECORDS_FILE)
    from lcab.bench.results import base_record

    first = base_record(cell_2x4, 1024, {})
    first.status = "ok"
    sink.write(first)
    for rank in range(8):
        host = "n1" if rank < 4 else "n2"
        (tmp_path / RANK_FILE.format(rank=rank)).write_text(json.dumps({"host": host, "pid": 1}))
    _write_failure(tmp_path, 2, "n1", 2048, "error", "RuntimeError: Connection closed by peer")
    _write_failure(tmp_path, 6, "n2", 2048, "timeout", "RuntimeError: gloo Timed out")
    oom_kill = "slurmstepd: error: Detected 1 oom-kill event(s) in step 77.0 cgroup.\n"
    killed = "srun: error: n2: task 5: Killed\n"
    added = settle(cell_2x4, JobEnd("77", "FAILED", srun_log=oom_kill + killed))
    assert [(r.seqlen, r.status) for r in added] == [(2048, "oom"), (4096, "skipped")]
    assert "rank 5 on n2" in added[0].reasons[0] and "SLURM job 77" in added[0].reasons[0]
    assert added[1].reasons[0].startswith("not run")
    assert [r.seqlen for r in read_records(tmp_path / RECORDS_FILE)] == [1024, 2048, 4096]
    assert settle(cell_2x4, JobEnd("77", "FAILED")) == []  # every length has its record now


def test_a_rank_s_own_error_outranks_the_scheduler_s_kill_of_its_peers(cell_2x4, tmp_path):
    _write_failure(tmp_path, 3, "n1", 1024, "error", "ValueError: kernel refused the shape")
    added = settle(cell_2x4, JobEnd("9", "FAILED", srun_log="srun: error: n2: tasks 4-7: Killed"))
    assert added[0].status == "error" and "rank 3 on n1" in added[0].reasons[0]
    assert "kernel refused" in added[0].reasons[0]


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("TIMEOUT", "timeout"),
        ("OUT_OF_MEMORY", "oom"),
        ("CANCELLED", "error"),
        ("NODE_FAIL", "error"),
    ],
)
def test_a_job_the_scheduler_ended_gets_its_state_as_the_reason(cell_2x4, tmp_path, state, status):
    added = settle(cell_2x4, JobEnd("41", state))
    assert [r.status for r in added] == [status, "skipped", "skipped"]
    assert f"SLURM job 41 ended {state}" in added[0].reasons[0]
    assert all(r.pass_result(p).status == r.status for r in added for p in r.passes)


def test_sweep_status_reads_each_cell_from_its_records_when_slurm_is_silent(cell_2x4, tmp_path):
    from lcab.bench.results import base_record
    from lcab.sweep import sweep_status

    for name, statuses in (("0_a", ["ok", "ok", "ok"]), ("1_b", ["ok", "timeout", "skipped"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "slurm.json").write_text(
            json.dumps(
                {
                    "job_id": "999999",
                    "seqlens": [1024, 2048, 4096],
                    "shape": {"nodes": 2, "tasks_per_node": 4, "timeout_min": 35},
                }
            )
        )
        sink = JsonlSink(folder / RECORDS_FILE)
        for seqlen, status in zip((1024, 2048, 4096), statuses, strict=True):
            record = base_record(cell_2x4, seqlen, {})
            record.status = status
            sink.write(record)
    (tmp_path / "2_c").mkdir()
    (tmp_path / "2_c" / "slurm.json").write_text(
        json.dumps(
            {
                "job_id": "999998",
                "seqlens": [1024],
                "shape": {"nodes": 1, "tasks_per_node": 1, "timeout_min": 5},
            }
        )
    )
    states = {c.folder: c.state for c in sweep_status(tmp_path)}
    assert states == {"0_a": "finished", "1_b": "failed (timeout)", "2_c": "not started"}


_SIGTERM_IN_A_JOB = """
import os, signal, sys
from lcab.bench.scheduled import stopped_by_scheduler, watch_scheduler_signals
seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))  # submitit's bypass
watch_scheduler_signals()
print("before", stopped_by_scheduler())
os.kill(os.getpid(), signal.SIGTERM)
print("after", stopped_by_scheduler(grace_s=5.0), seen == [signal.SIGTERM])
"""


def test_the_scheduler_s_sigterm_is_noted_and_the_previous_handler_still_runs():
    import subprocess
    import sys

    from tests.helpers.cli import cli_env

    done = subprocess.run(
        [sys.executable, "-c", _SIGTERM_IN_A_JOB],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["before", "False", "after", "True", "True"]


def test_what_a_rank_ran_into_after_a_sigterm_is_a_symptom_not_the_cause(cell_2x4, tmp_path):
    # sacct says FAILED: rank 5 was killed, srun's --kill-on-bad-exit then sent SIGTERM to the
    # others; rank 1 noted it and failed on something that reads like its own error
    failure = {"rank": 1, "host": "n1", "seqlen": 1024, "status": "error"}
    failure |= {
        "error": "SIGTERM reached this rank (the scheduler, or srun ending the step) "
        "during seqlen 1024; then: "
        "ValueError: shard is empty",
        "stopped_by_scheduler": True,
    }
    (tmp_path / FAILURE_FILE.format(rank=1)).write_text(json.dumps(failure))
    added = settle(cell_2x4, JobEnd("12", "FAILED", srun_log="srun: error: n2: task 5: Killed"))
    assert added[0].status == "error"  # no oom-kill event logged: a kill, not memory
    assert (
        added[0].reasons[0].startswith("rank 5 on n2 died: Killed (SIGKILL; slurmstepd logged no")
    )


def test_a_real_error_before_the_stop_still_comes_first(cell_2x4, tmp_path):
    _write_failure(tmp_path, 3, "n1", 1024, "oom", "torch.OutOfMemoryError: CUDA out of memory")
    failure = {"rank": 1, "host": "n1", "seqlen": 1024, "status": "error"}
    failure |= {"error": "SIGTERM reached this rank", "stopped_by_scheduler": True}
    (tmp_path / FAILURE_FILE.format(rank=1)).write_text(json.dumps(failure))
    added = settle(cell_2x4, JobEnd("13", "FAILED"))
    assert added[0].status == "oom" and "rank 3 on n1" in added[0].reasons[0]


def test_the_launcher_caps_the_wait_between_sacct_polls(monkeypatch):
    from submitit.slurm.slurm import SlurmJob

    from lcab.launch.slurm_launcher import _poll_every

    monkeypatch.setattr(SlurmJob, "watcher", SlurmJob.watcher)  # restored after the test
    assert SlurmJob.watcher._delay_s == 600  # submitit's own cap
    _poll_every(3.0, "local")  # submitit's local executor: not SLURM's watcher
    assert SlurmJob.watcher._delay_s == 600
    _poll_every(3.0, "slurm")
    assert SlurmJob.watcher._delay_s == 3
