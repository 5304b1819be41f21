"""Cluster sweeps on a real SLURM cluster (two emulated nodes): shapes, ranks, faults, resume.

Every test runs the real CLI (``python -m lcab.main -m launcher=slurm ...``) and checks what
SLURM itself reports (``sacct``) next to what the records say.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import read_jsonl, run_lcab, start_lcab

pytestmark = pytest.mark.slurm

SLURM = ("launcher=slurm", "hydra.launcher.poll_s=3")
"""The generic preset as a user runs it (the cluster's default partition), looking at the jobs'
states every 3 s as the local cluster's own preset does (``launcher=slurm_local``): a job that
ended without a result is noticed within seconds, not up to a minute later."""


def lcab(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_lcab(*args, env=env, timeout=timeout)


def job_folders(sweep: Path) -> list[Path]:
    return sorted(p.parent for p in sweep.glob("*/slurm.json"))


def job_id(folder: Path) -> str:
    return str(json.loads((folder / "slurm.json").read_text())["job_id"])


def step(env: dict[str, str], job: str) -> tuple[int, int]:
    """(nodes, tasks) of the job's first srun step, as sacct reports them."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-j", job, "-o", "JobID,NNodes,NTasks"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        jid, nodes, tasks = line.split("|")
        if jid.endswith(".0"):
            return int(nodes), int(tasks)
    raise AssertionError(f"no srun step for job {job}: {out}")


def nothing_left(env: dict[str, str], sweep: Path) -> None:
    """No job of the cluster queued, and no process of this sweep alive on any node."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        queued = subprocess.run(
            ["squeue", "-h"], env=env, capture_output=True, text=True
        ).stdout.strip()
        alive = [
            line
            for line in subprocess.run(
                ["ps", "-ww", "-eo", "stat=,args="], capture_output=True, text=True
            ).stdout.splitlines()
            if str(sweep) in line and not line.startswith("Z")
        ]
        if not queued and not alive:
            return
        time.sleep(1)
    raise AssertionError(f"left behind: queue {queued!r}, processes {alive}")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_each_cell_is_one_job_over_two_nodes_with_one_task_per_rank(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    done = lcab(
        slurm_cluster,
        "-m",
        *SLURM,
        "cp=ulysses,ring",
        "kernel=ranges",
        "mask=causal,document",
        "topology=2x2",
        "debug=default",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    folders = job_folders(sweep)
    assert len(folders) == 4
    for folder in folders:
        assert step(slurm_cluster, job_id(folder)) == (2, 4)
    merged = read_jsonl(sweep / "records.jsonl")
    assert len(merged) == 8  # 4 cells x 2 lengths, merged at the sweep root
    for r in merged:
        assert r["status"] == "ok", r["reasons"]
        assert r["world_size"] == 4 and r["nodes"] == 2 and r["slurm_tasks"] == 4
        assert r["rank_hosts"] == ["n1", "n1", "n2", "n2"]
        assert r["slurm_job_id"] and r["slurm_nodelist"]
        for p in ("fwd", "bwd"):
            assert r[p]["max_abs_err"] is not None
            assert r[p]["max_abs_err"] <= r["numerics_tolerance"]
        assert r["comm_bytes_measured"] == r["comm_bytes_analytic"] > 0


def test_a_topology_sweep_gets_one_shape_per_cell_and_ulysses_stays_in_a_node(
    slurm_cluster, tmp_path
):
    sweep = tmp_path / "sweep"
    done = lcab(
        slurm_cluster,
        "-m",
        *SLURM,
        "cp=usp",
        "cp.ulysses_degree=2",
        "kernel=ranges",
        "mask=causal",
        "topology=local2,2x2",
        "debug=default",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shapes = sorted(step(slurm_cluster, job_id(f)) for f in job_folders(sweep))
    assert shapes == [(1, 2), (2, 4)]
    two_nodes = [r for r in read_jsonl(sweep / "records.jsonl") if r["nodes"] == 2]
    assert two_nodes
    for r in two_nodes:
        assert r["status"] == "ok", r["reasons"]
        assert r["cp_params"]["ulysses_degree"] == 2 and r["cp_params"]["ring_degree"] == 2
        hosts = r["rank_hosts"]  # Ulysses groups are consecutive ranks: (0, 1) and (2, 3)
        assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2]


def test_a_cell_that_cannot_be_built_is_a_skipped_record_and_never_submitted(
    slurm_cluster, tmp_path
):
    """Ulysses over 6 ranks cannot split 8 heads: that cell is recorded skipped with the reason
    and never reaches the scheduler, while the sweep's other cell runs."""
    before = _jobs_known(slurm_cluster)
    sweep = tmp_path / "sweep"
    done = lcab(
        slurm_cluster, "-m", *SLURM, "cp=ulysses", "kernel=ranges", "mask=causal",
        "topology=local2,local6", "debug=default", f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(sweep / "records.jsonl")
    assert {r["status"] for r in records if r["world_size"] == 2} == {"ok"}
    six = sorted((r for r in records if r["world_size"] == 6), key=lambda r: r["seqlen"])
    assert six and {r["status"] for r in six} == {"skipped"}
    assert "heads_q=8 is not divisible by the Ulysses degree 6" in " ".join(six[0]["reasons"])
    assert _jobs_known(slurm_cluster) - before == 1  # only the buildable cell was submitted


# Lengths for the fault tests: a fault lands after the first length is recorded and must find the
# job still running (the second and third lengths are its window), and every length the fault
# left unsettled is run again on resume or requeue. The naive kernel's time grows as the square
# of the length: 1024, 1536, 2048 cost 1 + 2.25 + 4 units where 1024, 2048, 4096 cost 1 + 4 + 16,
# while the window stays several seconds on an idle 2-core machine.
FAULT_LENGTHS = "seqlen.values=[1024,1536,2048]"
# The least protocol (no warm-up, one timed call per pass; numerics still checked): these tests
# read statuses and reasons, never a time. Two calls per pass instead of quick's five (first,
# warm-up, three timed) take about a quarter off a naive cell's CPU time; the window stays seconds.
FAULT_BENCH = ("bench=quick", "bench.warmup=0", "bench.reps=1", "bench.progress=false")

SLOW_SWEEP = (
    "-m",
    *SLURM,
    "cp=ring",
    "kernel=naive,ranges",
    "mask=causal,document",
    FAULT_LENGTHS,
    "topology=2x2",
    *FAULT_BENCH,
)


def test_cancelled_and_killed_cells_end_as_records_and_resume_reruns_only_them(
    slurm_cluster, tmp_path
):
    sweep = tmp_path / "sweep"
    proc = start_lcab(*SLOW_SWEEP, f"hydra.sweep.dir={sweep}", env=slurm_cluster)
    try:
        wait_for(lambda: len(job_folders(sweep)) == 4, 120, "the sweep's submission")
        cancel, kill = (
            next(f for f in job_folders(sweep) if f"kernel=naive,mask={mask}," in f.name)
            for mask in ("causal", "document")
        )
        wait_for(lambda: (cancel / "rank-3.json").exists(), 180, "the first cell's ranks")
        subprocess.run(["scancel", job_id(cancel)], env=slurm_cluster, check=True)
        wait_for(lambda: (kill / "records.jsonl").exists(), 180, "the second cell's first length")
        victim = json.loads((kill / "rank-3.json").read_text())
        assert victim["host"] == "n2"
        os.kill(int(victim["pid"]), signal.SIGKILL)
        struck = time.monotonic()
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        assert time.monotonic() - struck < 120  # bounded: detection, not the time limit
    finally:
        if proc.poll() is None:
            proc.kill()
    nothing_left(slurm_cluster, sweep)
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for r in read_jsonl(sweep / "records.jsonl"):
        by_cell.setdefault((r["kernel"], r["mask"]), []).append(r)
    assert all(len(v) == 3 for v in by_cell.values()) and len(by_cell) == 4
    cancelled = by_cell[("naive", "causal")]
    assert any(r["status"] == "error" and "CANCELLED" in r["reasons"][0] for r in cancelled)
    killed = by_cell[("naive", "causal_document")]
    failed = [r for r in killed if r["status"] not in ("ok", "skipped")]
    assert len(failed) == 1 and failed[0]["status"] == "error", failed  # a kill, not memory
    assert "rank 3 on n2" in failed[0]["reasons"][0] and "no oom-kill" in failed[0]["reasons"][0]
    for cell in (cancelled, killed):  # lengths after the failure: skipped, not lost
        statuses = [r["status"] for r in sorted(cell, key=lambda r: r["seqlen"])]
        first_bad = next(i for i, s in enumerate(statuses) if s != "ok")
        assert all(s == "skipped" for s in statuses[first_bad + 1 :])
    for key in (("ranges", "causal"), ("ranges", "causal_document")):
        assert [r["status"] for r in by_cell[key]] == ["ok"] * 3  # the other cells finished
    settled_ids = {f.name: job_id(f) for f in job_folders(sweep) if "kernel=ranges" in f.name}
    settled_lines = {
        f.name: (f / "records.jsonl").read_text()
        for f in job_folders(sweep)
        if "kernel=ranges" in f.name
    }

    again = lcab(slurm_cluster, *SLOW_SWEEP, "resume=true", f"hydra.sweep.dir={sweep}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (again.stdout + again.stderr).count("settled, not submitted") == 2
    for folder in job_folders(sweep):
        if "kernel=ranges" in folder.name:  # not submitted again, records untouched
            assert job_id(folder) == settled_ids[folder.name]
            assert (folder / "records.jsonl").read_text() == settled_lines[folder.name]
    final = read_jsonl(sweep / "records.jsonl")
    assert len(final) == 12 and all(r["status"] == "ok" for r in final), [
        (r["kernel"], r["mask"], r["seqlen"], r["status"]) for r in final
    ]
    nothing_left(slurm_cluster, sweep)


def test_a_cell_over_its_time_limit_ends_as_timeout(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    start = time.monotonic()
    done = lcab(
        slurm_cluster,
        "-m",
        *SLURM,
        "hydra.launcher.timeout_min=1",
        "cp=ring",
        "kernel=naive",
        "mask=causal",
        "seqlen.values=[2048,8192,16384]",
        "topology=2x2",
        "bench=quick",
        "bench.progress=false",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - start < 240
    cell = sorted(read_jsonl(sweep / "records.jsonl"), key=lambda r: r["seqlen"])
    assert len(cell) == 3
    statuses = [r["status"] for r in cell]
    assert "timeout" in statuses, [(r["status"], r["reasons"]) for r in cell]
    hit = statuses.index("timeout")
    assert "time limit" in cell[hit]["reasons"][0] or "TIMEOUT" in cell[hit]["reasons"][0]
    assert all(s == "skipped" for s in statuses[hit + 1 :])
    nothing_left(slurm_cluster, sweep)


def _jobs_known(env: dict[str, str]) -> int:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-a", "-S", "now-1days", "-o", "JobID"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return len(out.split())


def test_dry_run_prints_shapes_and_gpu_hours_and_submits_nothing(slurm_cluster, tmp_path):
    before = _jobs_known(slurm_cluster)
    sweep = tmp_path / "sweep"
    done = lcab(
        slurm_cluster,
        "-m",
        *SLURM,
        "cp=ulysses,ring",
        "kernel=ranges",
        "topology=local2,2x2",
        "dry_run=true",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 nodes x 2 tasks" in done.stdout and "1 node x 2 tasks" in done.stdout
    assert "4 job(s)" in done.stdout and "CPU core-hours" in done.stdout  # no GPU: CPU units
    assert not sweep.exists()
    assert _jobs_known(slurm_cluster) == before
    queued = subprocess.run(["squeue", "-h"], env=slurm_cluster, capture_output=True, text=True)
    assert queued.stdout.strip() == ""


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("topology=4x8",), "needs 4 nodes"),
        (("hydra.launcher.partition=gpu",), "partition='gpu' is unknown"),
        (("cp=usp", "cp.ulysses_degree=4"), "Ulysses groups must stay inside a node"),
        (("topology=auto",), "devices_per_node"),
    ],
)
def test_shapes_the_cluster_cannot_run_exit_2_before_submitting(
    slurm_cluster, tmp_path, args, needle
):
    before = _jobs_known(slurm_cluster)
    base = ["launcher=slurm", "cp=ring", "topology=2x2", "debug=default"]
    done = lcab(slurm_cluster, *base, *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert needle in done.stderr
    assert _jobs_known(slurm_cluster) == before


def test_launcher_slurm_without_sbatch_exits_2_naming_it(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no SLURM client on PATH
    done = lcab(env, "launcher=slurm", "debug=default", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2
    assert "sbatch" in done.stderr


def test_a_preempted_cell_is_requeued_and_keeps_the_lengths_it_settled(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    args = (
        "-m",
        *SLURM,
        "cp=ring",
        "kernel=naive",
        "mask=causal",
        FAULT_LENGTHS,
        "topology=2x2",
        *FAULT_BENCH,
        f"hydra.sweep.dir={sweep}",
    )
    proc = start_lcab(*args, env=slurm_cluster)
    try:
        wait_for(lambda: len(job_folders(sweep)) == 1, 120, "the submission")
        (folder,) = job_folders(sweep)
        wait_for(lambda: (folder / "records.jsonl").exists(), 180, "the first length")
        first = (folder / "records.jsonl").read_text()
        # what SLURM sends before pre-empting: submitit requeues the job (with resume=true)
        subprocess.run(["scancel", "--signal=USR2", job_id(folder)], env=slurm_cluster, check=True)
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    cell = read_jsonl(folder / "records.jsonl")
    assert sorted(r["seqlen"] for r in cell) == [1024, 1536, 2048]  # no length twice
    assert all(r["status"] == "ok" for r in cell), [(r["seqlen"], r["reasons"]) for r in cell]
    assert (folder / "records.jsonl").read_text().startswith(first)  # kept, not measured again
    log = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_0_log.*"))
    assert "resume: 1 settled record(s) kept" in log or "settled record(s) kept" in log
    nothing_left(slurm_cluster, sweep)


def test_a_job_sbatch_refuses_ends_as_records_with_the_scheduler_s_message(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    done = lcab(
        slurm_cluster,
        "-m",
        *SLURM,
        "+hydra.launcher.additional_parameters.nodelist=n9",  # no such node
        "cp=ring",
        "kernel=ranges",
        "mask=causal,document",
        "topology=2x2",
        "debug=default",
        f"hydra.sweep.dir={sweep}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    merged = read_jsonl(sweep / "records.jsonl")
    assert len(merged) == 4  # 2 cells x 2 lengths: refused, but every length recorded
    first = [r for r in merged if r["status"] == "error"]
    assert len(first) == 2 and all("SLURM refused the job" in r["reasons"][0] for r in first)
    assert all(r["status"] in ("error", "skipped") for r in merged)


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process, read from /proc (never truncated)."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended while we looked
        out[int(proc.name)] = (parent, args)
    return out


def _worker_running(sweep: Path) -> bool:
    """Whether the cell's supervised worker runs: a grandchild of the job's task (the task
    starts a forkserver, the forkserver the worker)."""
    table = _processes()
    tasks = {
        pid
        for pid, (_, args) in table.items()
        if "submitit.core._submit" in args and str(sweep) in args
    }
    servers = {pid for pid, (parent, _) in table.items() if parent in tasks}
    return any(parent in servers for parent, _ in table.values())


def test_a_cancelled_one_task_cell_records_the_scheduler_s_state(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    proc = start_lcab(
        "-m",
        *SLURM,
        "kernel=naive",
        "mask=causal",
        "seqlen.values=[4096,8192]",
        "bench=quick",
        "bench.progress=false",
        f"hydra.sweep.dir={sweep}",
        env=slurm_cluster,
    )
    try:
        wait_for(lambda: len(job_folders(sweep)) == 1, 120, "the submission")
        (folder,) = job_folders(sweep)
        wait_for(lambda: _worker_running(sweep), 240, "the cell's worker")
        time.sleep(2)  # well inside the first length (it takes tens of seconds)
        subprocess.run(["scancel", job_id(folder)], env=slurm_cluster, check=True)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    nothing_left(slurm_cluster, sweep)
    sacct = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-o", "State", "-j", job_id(folder)],
        env=slurm_cluster,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert sacct.split()[0] == "CANCELLED", sacct
    cell = sorted(read_jsonl(folder / "records.jsonl"), key=lambda r: r["seqlen"])
    assert [r["seqlen"] for r in cell] == [4096, 8192]  # every length has its record
    assert cell[0]["status"] == "error"
    assert f"SLURM job {job_id(folder)} ended CANCELLED" in cell[0]["reasons"][0], cell[0]
    assert cell[1]["status"] == "skipped" and cell[1]["reasons"][0].startswith("not run: ")
    assert not any("exited with code" in " ".join(r["reasons"]) for r in cell)
