"""`DistContext`: this rank's place in the world and its process groups.

Locally, lcab's supervisor starts one process per rank and they meet through a file rendezvous
in the job folder (no ports, so parallel tests and jobs never clash). Under torchrun or SLURM
the ranks already exist and are joined from the environment (RANK, WORLD_SIZE, MASTER_ADDR...).
Collectives time out after ``timeout_s`` so a lost peer ends in an error instead of a hang.

GPU binding, two ranks on one GPU (refused under NCCL, a numerics-only check over gloo), thread
caps and NCCL stream priority: the cp guide's "Topology and process groups" and "GPU binding".
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lcab.distributed import staging
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
else:
    torch = lazy_module("torch", globals())
    dist = lazy_module("torch.distributed", globals(), "dist")


@dataclass
class DistContext:
    """Rank, world, node layout and a cache of sub-groups."""

    rank: int
    world: int
    devices_per_node: int
    backend: str
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    high_priority: bool = False
    """NCCL only: every group's streams are high-priority CUDA streams."""
    shared_device: bool = False
    """Whether this rank's GPU is also another rank's (gloo only): timings are not a measurement."""
    _groups: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    @property
    def node(self) -> int:
        """Node index of this rank (ranks are numbered node-major)."""
        return self.rank // self.devices_per_node

    @classmethod
    def start_local(
        cls,
        rank: int,
        world: int,
        devices_per_node: int,
        backend: str,
        rendezvous: str,
        timeout_s: float,
        device: str = "cpu",
        high_priority: bool = False,
    ) -> DistContext:
        """Join a world started by lcab's supervisor (file rendezvous): every rank on this host."""
        staging.choose_mode(device, backend, os.environ)  # a forced mode that cannot work: now
        bound = _bind(device, rank, world, backend, per_task=False)
        return cls._join(
            f"file://{rendezvous}", rank, world, devices_per_node, backend, bound,
            timeout_s, high_priority,
        )  # fmt: skip

    @classmethod
    def from_environment(
        cls, backend: str, timeout_s: float, device: str = "cpu", high_priority: bool = False
    ) -> DistContext:
        """Join a world launched by torchrun or SLURM (env:// rendezvous).

        Inside a SLURM task the variables are derived from SLURM's (`scheduler_environment`).
        """
        staging.choose_mode(device, backend, os.environ)  # a forced mode that cannot work: now
        per_task = "SLURM_PROCID" in os.environ
        for key, value in scheduler_environment(os.environ).items():
            os.environ.setdefault(key, value)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        bound = _bind(device, int(os.environ.get("LOCAL_RANK", 0)), local, backend, per_task)
        return cls._join("env://", rank, world, local, backend, bound, timeout_s, high_priority)

    @classmethod
    def _join(
        cls,
        init_method: str,
        rank: int,
        world: int,
        devices_per_node: int,
        backend: str,
        bound: torch.device,
        timeout_s: float,
        high_priority: bool,
    ) -> DistContext:
        """Rendezvous, compare GPUs, then start the process group on the rendezvous' store.

        ``init_process_group(device_id=...)`` connects NCCL at once, which refuses two ranks on
        one GPU with its own "Duplicate GPU": so the ranks first compare their GPUs through the
        rendezvous store (`gpu_verdict`), then hand that store to ``init_process_group``.
        """
        timeout = timedelta(seconds=timeout_s)
        store = rendezvous_store(init_method, rank, world, timeout)
        shared = gpu_verdict(store, rank, world, bound, backend)
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=timeout,
            **_device_id(bound, backend),
            **pg_options(backend, high_priority),
        )
        context = cls(rank, world, devices_per_node, backend, bound, high_priority)
        context.shared_device = shared
        staging.configure(bound, backend)
        return context

    def group(self, ranks: list[int] | tuple[int, ...], tag: str = "") -> Any:
        """The process group of ``ranks``: the world for all ranks, None for a single rank.

        A ``tag`` names a twin over the same ranks (another NCCL communicator and stream), for
        traffic that must not queue behind the untagged group's. Every rank must create every
        group in the same order (`lcab.distributed.groups`).
        """
        members = tuple(int(r) for r in ranks)
        if len(members) == 1:
            return None
        if members == tuple(range(self.world)) and not tag:
            return self._world_group()
        key = (tag, *members)
        if key not in self._groups:
            self._groups[key] = self._new_group(members, tag)
        return self._groups[key]

    def _world_group(self) -> Any:
        return dist.group.WORLD

    def _new_group(self, members: tuple[int, ...], tag: str) -> Any:
        """``new_group`` (the schedule check's context records the call instead)."""
        options = pg_options(self.backend, self.high_priority)
        return dist.new_group(list(members), backend=self.backend, **options)

    def barrier(self) -> None:
        """World barrier."""
        dist.barrier()

    def close(self) -> None:
        """Tear the process group down."""
        if dist.is_initialized():
            dist.destroy_process_group()


def rendezvous_store(init_method: str, rank: int, world: int, timeout: timedelta) -> Any:
    """The store ``init_process_group`` would make of ``init_method`` (its own rendezvous)."""
    store, _, _ = next(dist.rendezvous(init_method, rank, world, timeout=timeout))
    store.set_timeout(timeout)
    return store


GPU_KEY = "lcab/bound_gpu/{rank}"
"""The store key under which each rank leaves the (host, GPU UUID) it bound."""
READ_KEY = "lcab/bound_gpu_read/{rank}"
"""Set by each rank once it has read every rank's GPU."""


def gpu_verdict(store: Any, rank: int, world: int, bound: torch.device, backend: str) -> bool:
    """Whether ranks share a GPU (gloo: allowed and noted); two NCCL ranks on one are refused.

    Every rank leaves the (host, UUID) of its GPU in the store and reads all, so all reach the
    same verdict. UUIDs, not indices: a task that sees one GPU binds index 0 whether SLURM gave
    it its own GPU or every task the same one. CPU ranks leave nothing.

    Raises:
        RuntimeError: NCCL ranks of one host share a GPU.

    """
    if bound.type != "cuda":
        return False
    mine = (node_name(), str(torch.cuda.get_device_properties(bound).uuid))
    store.set(GPU_KEY.format(rank=rank), "\t".join(mine))
    keys = [GPU_KEY.format(rank=r) for r in range(world)]
    store.wait(keys)
    shared = shared_gpu([store.get(key).decode().split("\t") for key in keys])
    # rank 0 hosts an env:// store: it leaves only when every rank has read (a refusal ends
    # the process, and with it the store, under a rank still reading)
    store.set(READ_KEY.format(rank=rank), "1")
    if rank == 0:
        store.wait([READ_KEY.format(rank=r) for r in range(world)])
    if shared is None:
        return False
    if backend == "gloo":
        return True
    first, second, host, uuid = shared
    raise RuntimeError(
        f"ranks {first} and {second} share GPU {uuid} on {host}, which NCCL refuses: give "
        "each rank its own GPU (one task per GPU: --gpus-per-task=1, or as many tasks per "
        "node as GPUs), or use topology.backend=gloo for a numerics-only check"
    )


def shared_gpu(bound: list[Any]) -> tuple[int, int, str, str] | None:
    """The first two ranks that bound one GPU — (first, second, host, uuid) — or None."""
    first: dict[tuple[str, str], int] = {}
    for rank, key in enumerate(bound):
        host, uuid = str(key[0]), str(key[1])
        if (host, uuid) in first:
            return first[(host, uuid)], rank, host, uuid
        first[(host, uuid)] = rank
    return None


def binding_problem(
    ranks_on_node: int, visible_gpus: int, backend: str = "nccl", per_task: bool = False
) -> str | None:
    """Why ``ranks_on_node`` ranks cannot each get a GPU of the ``visible_gpus`` (None: they can).

    ``per_task``: each rank may see GPUs of its own (SLURM ``--gpus-per-task``: the UUIDs
    compared after joining decide); else all ranks of the node see the same GPUs. Over gloo
    ranks may share a GPU (numerics only), so only a missing GPU is a problem.
    """
    if visible_gpus < 1:
        return "problem.device=cuda but no GPU is visible to this process"
    if backend == "gloo":
        return None
    if ranks_on_node > visible_gpus and (visible_gpus > 1 or not per_task):
        return (
            f"{ranks_on_node} ranks on one node but only {visible_gpus} visible GPUs: two NCCL "
            'ranks would share a GPU, which NCCL refuses ("Duplicate GPU"); use at most '
            f"{visible_gpus} rank(s) per node (topology.devices_per_node={visible_gpus}), or "
            "topology.backend=gloo for a numerics-only check (ranks then share the GPU and "
            "their timings are not a measurement)"
        )
    return None


def local_gpu_index(local_rank: int, visible_gpus: int) -> int:
    """The GPU a rank binds: its local rank among all visible GPUs, GPU 0 of a task's own."""
    return local_rank % visible_gpus


def _bind(
    kind: str, local_rank: int, ranks_on_node: int, backend: str = "nccl", per_task: bool = False
) -> torch.device:
    """Set and return this rank's device (CPU: nothing to bind); refuse a shared NCCL GPU."""
    if kind != "cuda":
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    why = binding_problem(ranks_on_node, visible, backend, per_task)
    if why is not None:
        raise RuntimeError(why)
    device = torch.device("cuda", local_gpu_index(local_rank, visible))
    torch.cuda.set_device(device)
    threads = gpu_rank_threads(ranks_on_node, os.environ)
    if torch.get_num_threads() > threads:
        torch.set_num_threads(threads)
    return device


def gpu_rank_threads(ranks_on_node: int, env: Mapping[str, str]) -> int:
    """Host threads one GPU rank may use: its share of the CPUs, so ranks do not oversubscribe.

    Under SLURM a task's CPUs are its own (``SLURM_CPUS_PER_TASK``); otherwise the ranks of a
    node share this process's affinity. torch's default puts eight ranks' threads on each core.
    """
    per_task = env.get("SLURM_CPUS_PER_TASK", "")
    if per_task.isdigit() and int(per_task) > 0:
        return int(per_task)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cpus or 1) // max(ranks_on_node, 1))


def pg_options(backend: str, high_priority: bool) -> dict[str, Any]:
    """``pg_options`` for ``init_process_group``/``new_group``: NCCL high-priority streams.

    ``new_group`` would otherwise build default options (normal priority), so every group gets
    them. Nothing for gloo or when not asked (builds without NCCL lack the class).
    """
    if backend != "nccl" or not high_priority:
        return {}
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    return {"pg_options": options}


def _device_id(device: torch.device, backend: str) -> dict[str, Any]:
    """``device_id`` for ``init_process_group`` when NCCL runs on a bound GPU (else nothing)."""
    return {"device_id": device} if device.type == "cuda" and backend == "nccl" else {}


def _first_host(nodelist: str) -> str:
    """First host of a SLURM node list (``n[1-2]``, ``gpu-[01-04],gpu-07``, ``n1,n2``)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        hosts = out.stdout.split()
        if hosts:
            return hosts[0]
    except (OSError, subprocess.SubprocessError):
        pass
    head = nodelist.split(",")[0]
    if "[" in head:  # prefix[a-b,...]: the first number of the range, zero padding kept
        prefix, rest = head.split("[", 1)
        return prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def scheduler_environment(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed's env:// variables derived from SLURM's, for a task of a SLURM job.

    The rendezvous is the first host of the job's node list, on port 20000 + job id mod 20000,
    so two jobs sharing a node never pick the same port. Variables already set (torchrun's) win.
    """
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return {}
    world = int(env["SLURM_NTASKS"])
    nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
    out = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(max(world // max(nodes, 1), 1)),
    }
    job_id = env.get("SLURM_JOB_ID")
    if job_id and job_id.isdigit():
        out["MASTER_PORT"] = str(20000 + int(job_id) % 20000)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        out["MASTER_ADDR"] = _first_host(nodelist)
    return {k: v for k, v in out.items() if k not in env}


def node_name() -> str:
    """The node: SLURM's node name (emulated nodes may share a host), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
