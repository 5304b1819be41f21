"""The SLURM job shape of a cell: nodes x tasks (one task per rank), GPUs, CPUs, memory, time.

Nodes and tasks follow from the topology (one GPU per task on GPU clusters); the time limit
from the work: ``bench.timeout_s`` per length plus a start-up allowance, so it never goes stale
when a sweep grows. Serves the launcher, ``dry_run=true`` and the pre-flight checks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from lcab.cell import Cell


@dataclass(frozen=True)
class SlurmSettings:
    """What a cluster preset (``conf/launcher/slurm*.yaml``) says about every job."""

    partition: str | None = None
    gpus_per_task: int = 0
    """GPUs per rank (0 on CPU clusters); ``gpus_per_node`` = this x tasks per node."""
    cpus_per_task: int = 1
    mem_gb_per_task: float | None = None
    startup_s: float = 300.0
    """Allowance for queue-to-first-length start-up (imports, rendezvous, compilation)."""
    timeout_min: int | None = None
    """A fixed time limit instead of the derived one (None: derive it)."""


@dataclass(frozen=True)
class JobShape:
    """One SLURM job: what ``sbatch`` is asked for (hashable: jobs are grouped by shape)."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    mem_gb: float | None
    timeout_min: int
    partition: str | None = field(default=None, compare=True)

    @property
    def tasks(self) -> int:
        """Total tasks (ranks)."""
        return self.nodes * self.tasks_per_node

    @property
    def gpus(self) -> int:
        """Total GPUs."""
        return self.nodes * self.gpus_per_node

    def gpu_hours(self) -> float:
        """Upper bound of the GPU-hours the job can spend (its time limit x its GPUs)."""
        return self.gpus * self.timeout_min / 60

    def executor_parameters(self) -> dict[str, Any]:
        """The shape as submitit ``AutoExecutor.update_parameters`` keywords."""
        params: dict[str, Any] = {
            "nodes": self.nodes,
            "tasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "timeout_min": self.timeout_min,
            "gpus_per_node": self.gpus_per_node or None,
        }
        if self.mem_gb is not None:
            params["mem_gb"] = self.mem_gb
        if self.partition is not None:
            params["slurm_partition"] = self.partition
        return params

    def describe(self) -> str:
        """One line for people: ``2 nodes x 4 tasks, 8 GPUs, 1:05 h, partition gpu``."""
        hours, minutes = divmod(self.timeout_min, 60)
        gpus = f"{self.gpus} GPUs" if self.gpus else "no GPU"
        part = self.partition or "(default partition)"
        return (
            f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.tasks_per_node} "
            f"task{'s' if self.tasks_per_node > 1 else ''}, {gpus}, "
            f"{self.cpus_per_task} CPU/task, limit {hours}:{minutes:02d} h, partition {part}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for the job's ``slurm.json``."""
        return asdict(self)


def time_limit_min(cell: Cell, settings: SlurmSettings) -> int:
    """Minutes a cell may run: start-up plus ``bench.timeout_s`` for each of its lengths."""
    if settings.timeout_min is not None:
        return settings.timeout_min
    seconds = settings.startup_s + len(cell.seqlens) * cell.bench.timeout_s
    return max(1, math.ceil(seconds / 60))


def job_shape(cell: Cell, settings: SlurmSettings) -> JobShape:
    """The job that runs ``cell``: one task per rank, ``topology.nodes`` nodes."""
    mem = None
    if settings.mem_gb_per_task is not None:
        mem = settings.mem_gb_per_task * cell.devices_per_node
    return JobShape(
        nodes=cell.nodes,
        tasks_per_node=cell.devices_per_node,
        gpus_per_node=settings.gpus_per_task * cell.devices_per_node,
        cpus_per_task=settings.cpus_per_task,
        mem_gb=mem,
        timeout_min=time_limit_min(cell, settings),
        partition=settings.partition,
    )
