"""The per-process composition memo (`lcab.config.compose_cache`).

Its answers are held to fresh compositions by Hydra's own implementation, copies are shown to be
independent, an edited config file or another working directory is shown to compose afresh, and
a planner sweep run as users run it is shown to compose each job once (pre-flight, Hydra's
sweeper check and its launcher sharing one composition).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from lcab.config import CONF_DIR, compose_cache, register_configs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def loader():
    """Hydra's config loader over ``conf/`` with the memo installed."""
    register_configs()
    compose_cache.install()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield GlobalHydra.instance().config_loader()
    GlobalHydra.instance().clear()


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=False)


@pytest.mark.parametrize(
    ("name", "overrides", "mode"),
    [
        ("config", ["kernel=sdpa", "mask=causal", "hydra.mode=RUN"], RunMode.RUN),
        ("plan", ["hydra.mode=MULTIRUN", "cp=ring", "topology=4x8"], RunMode.RUN),
        ("plan", ["cp=ring,usp", "topology=1x8"], RunMode.MULTIRUN),
    ],
)
def test_the_memo_answers_what_hydra_composes(loader, name, overrides, mode):
    fresh = loader._load_configuration_impl(
        config_name=name, overrides=list(overrides), run_mode=mode
    )
    first = loader.load_configuration(config_name=name, overrides=list(overrides), run_mode=mode)
    before = compose_cache.counts()
    again = loader.load_configuration(config_name=name, overrides=list(overrides), run_mode=mode)
    after = compose_cache.counts()
    assert after["reused"] == before["reused"] + 1 and after["composed"] == before["composed"]
    assert _plain(first) == _plain(fresh) == _plain(again)


def test_every_caller_gets_its_own_copy(loader):
    args = {"config_name": "config", "overrides": ["kernel=sdpa"], "run_mode": RunMode.RUN}
    first = loader.load_configuration(**args)
    first.hydra.job.num = 7
    first.problem.heads_q = 1234
    second = loader.load_configuration(**args)
    assert second.problem.heads_q != 1234 and OmegaConf.is_missing(second.hydra.job, "num")


def test_a_failing_composition_fails_every_time(loader):
    for _ in range(2):
        with pytest.raises(Exception, match="nosuch"):
            loader.load_configuration(
                config_name="config", overrides=["mask=nosuch"], run_mode=RunMode.RUN
            )


def test_an_edited_config_file_and_another_working_directory_compose_afresh(tmp_path, monkeypatch):
    register_configs()
    compose_cache.install()
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            args = {"config_name": "config", "overrides": ["topology=2x8"], "run_mode": RunMode.RUN}
            assert loader.load_configuration(**args).topology.nodes == 2
            path = conf / "topology" / "2x8.yaml"
            path.write_text(path.read_text().replace("nodes: 2", "nodes: 77"))
            stat = path.stat()
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
            assert loader.load_configuration(**args).topology.nodes == 77
            monkeypatch.chdir(tmp_path)
            assert loader.load_configuration(**args).hydra.runtime.cwd == str(tmp_path)
    finally:
        GlobalHydra.instance().clear()


def test_a_planner_sweep_composes_each_job_once(tmp_path):
    """Pre-flight, Hydra's mode probe, sweeper check and launcher share each job's composition."""
    script = (
        "import sys, json\n"
        "from lcab.plan.cli import run\n"
        "code = run(sys.argv[1:])\n"
        "from lcab.config import compose_cache\n"
        "from lcab.config.fork_map import usable_cores\n"
        "print('COUNTS ' + json.dumps(compose_cache.counts() | {'cores': usable_cores()}))\n"
    )
    argv = ["-m", "cp=ring,usp", "topology=1x8,2x8", "seqlen=per_device_8k"]
    out = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("COUNTS "))
    counts = json.loads(line.removeprefix("COUNTS "))
    jobs = 4
    workers = min(counts["cores"], jobs)  # the pre-flight's processes (lcab.config.fork_map)
    # the mode probe (shared with Hydra's), this process's share of the jobs (the workers'
    # compositions come back with their answers), and Hydra's multirun master config
    assert counts["composed"] == len(range(0, jobs, workers)) + 2, counts
    # Hydra's mode probe, then each job's sweeper check and launch
    assert counts["reused"] == 1 + 2 * jobs, counts
    assert len(list(tmp_path.rglob("plan.jsonl"))) == jobs


def test_a_copy_takes_the_job_name_of_the_process_that_asks(loader):
    """The pre-flight composes under its own job name; Hydra's app runs under the task's, whose
    log file (``main.log``) is named by it: a reused composition must carry the asker's name."""
    from hydra.core.utils import JobRuntime

    args = {"config_name": "config", "overrides": ["kernel=naive"], "run_mode": RunMode.RUN}
    before = JobRuntime().get("name")
    try:
        JobRuntime().set("name", "preflight_name")
        assert loader.load_configuration(**args).hydra.job.name == "preflight_name"
        JobRuntime().set("name", "main")
        assert loader.load_configuration(**args).hydra.job.name == "main"
        named = ["hydra.job.name=chosen", "kernel=naive"]
        assert loader.load_configuration(**{**args, "overrides": named}).hydra.job.name == "chosen"
        JobRuntime().set("name", "other")
        assert loader.load_configuration(**{**args, "overrides": named}).hydra.job.name == "chosen"
    finally:
        JobRuntime().set("name", before)
