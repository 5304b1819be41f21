"""`lcab.config.fork_map`: the pre-flight's jobs on every core, and what happens when a worker
fails, dies or hangs (the parent computes that share itself, in bounded time)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from lcab.config import CONF_DIR, compose_cache, fork_map, register_configs

PARENT = os.getpid()


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def in_one_thread(test: Callable[[int], None]) -> None:
    """Run ``test(its process id)`` in a forked child of this test process.

    `fork_map` maps in its caller when the caller has other threads (a fork would copy a lock
    one of them holds), and an xdist worker may still hold a thread an earlier test left on
    purpose (a telemetry source that hangs is abandoned, never joined). A forked child has only
    the thread that forked, so the forking path is what runs here, whatever ran before.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        os.close(read_fd)
        code, message = 0, b""
        try:
            test(os.getpid())
        except BaseException as exc:
            code, message = 1, repr(exc).encode()[:8000]
        os.write(write_fd, message)
        os._exit(code)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 4096):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, b"".join(chunks).decode()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_results_are_the_map_in_order_and_the_work_is_shared(workers):
    def shared(parent: int) -> None:
        items = list(range(11))
        out = fork_map.fork_map(_square, items, workers)
        assert [value for value, _ in out] == [x * x for x in items]
        pids = {pid for _, pid in out}
        assert len(pids) == workers and parent in pids, pids

    in_one_thread(shared)


def test_a_worker_that_dies_or_raises_has_its_share_done_by_the_parent():
    def fragile(x: int) -> tuple[int, int]:
        if os.getpid() != PARENT:
            if x == 1:
                os._exit(3)  # killed mid-share
            if x == 2:
                raise RuntimeError("worker only")
        return _square(x)

    out = fork_map.fork_map(fragile, list(range(6)), 3)
    assert [value for value, _ in out] == [x * x for x in range(6)]
    # shares 1 (items 1, 4) and 2 (items 2, 5) were redone here; share 0 was always here
    assert all(pid == PARENT for _, pid in out)


def test_a_worker_that_hangs_is_killed_and_its_share_redone(monkeypatch):
    monkeypatch.setattr(fork_map, "GRACE_S", 1.0)

    def stuck(x: int) -> tuple[int, int]:
        if os.getpid() != PARENT:
            time.sleep(600)
        return _square(x)

    started = time.monotonic()
    out = fork_map.fork_map(stuck, list(range(4)), 2)
    assert time.monotonic() - started < 60
    assert [value for value, _ in out] == [0, 1, 4, 9]


def test_a_worker_s_compositions_come_back_to_the_parent():
    register_configs()
    compose_cache.install()
    GlobalHydra.instance().clear()
    topologies = ["1x8", "2x8", "4x8", "8x8"]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()

            def load(topology: str) -> int:
                cfg = loader.load_configuration(
                    config_name="plan", overrides=[f"topology={topology}"], run_mode=RunMode.RUN
                )
                return int(cfg.topology.nodes)

            assert fork_map.fork_map(load, topologies, 2) == [1, 2, 4, 8]
            before = compose_cache.counts()
            assert [load(t) for t in topologies] == [1, 2, 4, 8]
            after = compose_cache.counts()
    finally:
        GlobalHydra.instance().clear()
    assert after["composed"] == before["composed"]  # the worker's two came back too
    assert after["reused"] == before["reused"] + len(topologies)


def test_a_config_typed_by_generated_classes_loads_in_a_fresh_process(tmp_path):
    """Workers send composed configs back pickled, and submitit sends each SLURM job's config to
    a fresh task: a process that has not generated the schema classes must still load it."""
    import pickle
    import subprocess
    import sys

    from hydra import compose

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=["kernel=ranges", "cp=ring", "mask=causal"])
    finally:
        GlobalHydra.instance().clear()
    path = tmp_path / "cfg.pkl"
    path.write_bytes(pickle.dumps(cfg))
    script = (
        "import pickle, sys\n"
        "from omegaconf import OmegaConf\n"
        "cfg = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "print(OmegaConf.get_type(cfg.kernel).__name__, cfg.cp.name, cfg.mask.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["RangesKernelConfig", "ring", "causal"]


def test_a_process_with_other_threads_maps_in_one_process():
    """A fork copies only the calling thread; a lock another thread holds would stay held in the
    worker, so with other threads alive nothing is forked."""
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        out = fork_map.fork_map(_square, list(range(6)), 3)
    finally:
        stop.set()
        other.join()
    assert [value for value, _ in out] == [x * x for x in range(6)]
    assert {pid for _, pid in out} == {PARENT}


def _inner_pids(x: int) -> tuple[int, set[int]]:
    """A map inside a map: the processes its items ran in."""
    return os.getpid(), {pid for _, pid in fork_map.fork_map(_square, [x, x + 1, x + 2], 2)}


def test_a_map_inside_a_map_runs_in_its_own_process():
    """The cores are the outer map's: an inner one (a job's lengths) forks no more workers."""

    def nested(parent: int) -> None:
        outcomes = fork_map.fork_map(_inner_pids, [0, 10], 2)
        assert len({outer for outer, _ in outcomes}) == 2, outcomes  # the outer map forked
        for outer, inner in outcomes:
            assert inner == {outer}
        assert not fork_map._MAPPING  # and a later map forks again
        assert len({pid for _, pid in fork_map.fork_map(_square, [1, 2, 3], 2)}) == 2

    in_one_thread(nested)
