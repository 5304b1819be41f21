"""`DistContext`: this rank's place in the world and its process groups.

Locally, lcab's supervisor starts one process per rank and they meet through a file rendezvous
in the job folder (no ports, so parallel tests and jobs never clash). Under torchrun or SLURM
the ranks already exist and are joined from the environment (RANK, WORLD_SIZE, MASTER_ADDR...).
Collectives time out after ``timeout_s`` so a lost peer ends in an error instead of a hang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    """Rank, world, node layout and a cache of sub-groups."""

    rank: int
    world: int
    devices_per_node: int
    backend: str
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _groups: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)

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
    ) -> DistContext:
        """Join a world started by lcab's supervisor (file rendezvous)."""
        if device == "cuda":
            torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
        dist.init_process_group(
            backend=backend,
            init_method=f"file://{rendezvous}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        return cls(rank, world, devices_per_node, backend, _device(device, rank))

    @classmethod
    def from_environment(cls, backend: str, timeout_s: float, device: str = "cpu") -> DistContext:
        """Join a world launched by torchrun or SLURM (env:// rendezvous)."""
        if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
            os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
            os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
            os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(
            os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", world))
        )
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        return cls(
            rank, world, local, backend, _device(device, int(os.environ.get("LOCAL_RANK", 0)))
        )

    def group(self, ranks: list[int] | tuple[int, ...]) -> Any:
        """The process group of ``ranks`` (the whole world for all ranks).

        ``torch.distributed.new_group`` must be called by every rank for every group in the same
        order: callers create all groups of a layout on every rank (see `lcab.distributed.groups`).
        """
        key = tuple(int(r) for r in ranks)
        if key == tuple(range(self.world)):
            return dist.group.WORLD
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(key), backend=self.backend)
        return self._groups[key]

    def barrier(self) -> None:
        """World barrier."""
        dist.barrier()

    def close(self) -> None:
        """Tear the process group down."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _device(kind: str, local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if kind == "cuda" else torch.device("cpu")
