"""GPU binding of CP ranks, through seams (no GPU here): which GPU, device_id, refusals, groups.

SLURM can show a task every GPU of its node or only its own (``--gpus-per-task``,
``--gpu-bind``); ``LOCAL_RANK % visible`` is right in both, ``set_device(LOCAL_RANK)`` fails in
the second and ``rank % visible`` doubles ranks up across nodes. The CUDA calls are replaced by
recorders here; what NCCL itself does with them needs the ``gpu`` tier.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

import lcab.distributed.context as context
from lcab.distributed.context import DistContext, binding_problem, local_gpu_index
from lcab.distributed.groups import Grid


@pytest.mark.parametrize(
    ("ranks", "visible", "per_task", "refused"),
    [
        (8, 8, False, False),
        (8, 1, True, False),  # a SLURM task with its own GPU
        (8, 1, False, True),  # eight NCCL ranks on the one GPU they all see
        (4, 8, False, False),
        (8, 4, False, True),
        (8, 4, True, True),
        (2, 0, False, True),
        (1, 0, False, True),
    ],
)
def test_binding_problem(ranks, visible, per_task, refused):
    why = binding_problem(ranks, visible, per_task=per_task)
    assert (why is not None) == refused
    if refused and visible:
        assert f"{ranks} ranks" in why and f"{visible} visible GPUs" in why


def test_local_gpu_index_one_gpu_per_task_or_all_gpus():
    assert [local_gpu_index(r, 8) for r in range(8)] == list(range(8))  # all GPUs visible
    assert [local_gpu_index(r, 1) for r in range(8)] == [0] * 8  # each task its own GPU
    assert local_gpu_index(9, 8) == 1


class FakeCuda:
    """Records what the rank asks of CUDA and NCCL."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, visible: int) -> None:
        self.bound: list[torch.device] = []
        self.init_kwargs: dict[str, Any] = {}
        monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
        monkeypatch.setattr(torch.cuda, "set_device", self.bound.append)
        monkeypatch.setattr(context.dist, "init_process_group", self._init)
        monkeypatch.setattr(context, "rendezvous_store", lambda *args: "store")
        monkeypatch.setattr(context, "gpu_verdict", lambda *args: False)
        self.threads = [torch.get_num_threads()]  # the test process's own count stays as it is
        monkeypatch.setattr(torch, "get_num_threads", lambda: self.threads[0])
        monkeypatch.setattr(torch, "set_num_threads", lambda n: self.threads.__setitem__(0, n))

    def _init(self, **kwargs: Any) -> None:
        self.init_kwargs = kwargs


ENV = {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}


@pytest.mark.parametrize(("visible", "gpu"), [(8, 3), (1, 0)])
def test_environment_rank_binds_local_rank_mod_visible_and_names_it_to_nccl(
    monkeypatch, visible, gpu
):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    if visible == 1:  # one GPU per task is SLURM's (--gpus-per-task); torchrun's ranks share one
        monkeypatch.setenv("SLURM_PROCID", ENV["RANK"])
    fake = FakeCuda(monkeypatch, visible)
    ctx = DistContext.from_environment("nccl", 60, "cuda")
    assert fake.bound == [torch.device("cuda", gpu)]
    assert fake.init_kwargs["device_id"] == torch.device("cuda", gpu)
    assert ctx.device == torch.device("cuda", gpu) and ctx.devices_per_node == 8


def test_environment_rank_refuses_more_ranks_than_gpus(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    fake = FakeCuda(monkeypatch, 4)
    with pytest.raises(RuntimeError, match="8 ranks on one node but only 4 visible GPUs"):
        DistContext.from_environment("nccl", 60, "cuda")
    assert fake.bound == [] and fake.init_kwargs == {}  # refused before touching NCCL


def test_cpu_and_gloo_get_no_device_id(monkeypatch, tmp_path):
    fake = FakeCuda(monkeypatch, 8)
    DistContext.start_local(1, 2, 2, "gloo", str(tmp_path / "rdv"), 60, "cpu")
    assert "device_id" not in fake.init_kwargs and fake.bound == []


def test_local_ranks_bind_their_rank(monkeypatch, tmp_path):
    fake = FakeCuda(monkeypatch, 4)
    DistContext.start_local(2, 4, 4, "nccl", str(tmp_path / "rdv"), 60, "cuda")
    assert fake.bound == [torch.device("cuda", 2)]
    assert fake.init_kwargs["device_id"] == torch.device("cuda", 2)


@pytest.mark.parametrize(
    ("world", "ulysses", "created"),
    [
        (4, 4, []),  # pure Ulysses: the world group, no singleton rings
        (4, 1, []),  # pure ring: the world ring, no singleton Ulysses groups
        (4, 2, [[0, 1], [2, 3], [0, 2], [1, 3]]),  # USP: every real group, same order
        (8, 2, [[0, 1], [2, 3], [4, 5], [6, 7], [0, 2, 4, 6], [1, 3, 5, 7]]),
    ],
)
def test_no_single_rank_groups_and_one_creation_order(monkeypatch, world, ulysses, created):
    made: list[list[int]] = []

    def new_group(ranks: list[int], backend: str) -> tuple[int, ...]:
        made.append(ranks)
        return tuple(ranks)

    monkeypatch.setattr(context.dist, "new_group", new_group)
    world_group = context.dist.group.WORLD
    for rank in range(world):  # every rank creates the same groups in the same order
        made.clear()
        ctx = DistContext(rank, world, world, "gloo")
        grid = Grid(world, ulysses, rank)
        a2a, ring = grid.create_groups(ctx)
        assert made == created
        for group, ranks in ((a2a, grid.my_ulysses_group()), (ring, grid.my_ring())):
            if len(ranks) == 1:
                assert group is None
            elif len(ranks) == world:
                assert group is world_group
            else:
                assert group == tuple(ranks)


def test_local_cuda_sweep_with_more_ranks_than_gpus_exits_2_before_running(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lcab.main",
            "cp=ring",
            "kernel=ranges",
            "topology=local4",
            "problem.device=cuda",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    visible = torch.cuda.device_count()
    expected = "no GPU is visible" if visible == 0 else f"only {visible} visible GPUs"
    if visible >= 4:
        pytest.skip("this host has a GPU per rank")
    assert expected in done.stderr and "topology=local4" in done.stderr


def test_gpu_rank_threads_share_the_node_or_take_the_task_cpus(monkeypatch):
    monkeypatch.setattr(context.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert context.gpu_rank_threads(8, {}) == 2  # 16 CPUs shared by 8 local ranks
    assert context.gpu_rank_threads(32, {}) == 1  # never below one
    assert context.gpu_rank_threads(8, {"SLURM_CPUS_PER_TASK": "6"}) == 6  # the task's own


def test_binding_caps_torch_threads_at_the_rank_share(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    fake = FakeCuda(monkeypatch, 8)
    monkeypatch.setattr(context.os, "sched_getaffinity", lambda pid: set(range(16)))
    threads = fake.threads
    threads[0] = 16  # torch's default: every core of the node
    DistContext.from_environment("nccl", 60, "cuda")
    assert threads == [2]
    threads[0] = 1  # a lower setting (bench.threads=1) is kept
    DistContext.from_environment("nccl", 60, "cuda")
    assert threads == [1]


@pytest.mark.parametrize(
    ("hosts", "refused"),
    [
        (["n1", "n1", "n2", "n2"], False),  # block distribution: node-major
        (["n1"] * 4, False),  # one host (local emulation of several nodes)
        (["n1", "n2", "n1", "n2"], True),  # srun --distribution=cyclic
    ],
)
def test_rank_hosts_must_be_node_major(hosts, refused):
    from lcab.bench.targets import node_major_problem

    why = node_major_problem(hosts, 2)
    assert (why is not None) == refused
    if refused:
        assert "ranks 0..1 run on n1, n2" in why and "--distribution=block" in why
