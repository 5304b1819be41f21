"""The schema of lcab's SLURM launcher (``hydra/launcher: lcab_slurm``).

Extends hydra-submitit-launcher's ``SlurmQueueConf`` (every sbatch option stays settable);
``nodes``, ``tasks_per_node``, ``gpus_per_node``, ``mem_gb`` and ``timeout_min`` are computed
per cell instead (`lcab.launch.shape`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

LAUNCHER_TARGET = "hydra_plugins.lcab_slurm.ShapedSlurmLauncher"
"""Hydra accepts launcher classes only under ``hydra_plugins.``; lcab registers its class under
this name at start-up (`lcab.launch.register_launcher`)."""


@dataclass
class LcabSlurmConf(SlurmQueueConf):
    """SLURM: one job per cell, one task per rank, shaped by the cell's topology."""

    _target_: str = LAUNCHER_TARGET
    cpus_per_task: int | None = 1
    """CPUs per rank (task)."""
    gpus_per_rank: int = 0
    """GPUs per rank: 0 on CPU clusters, 1 on GPU clusters (gpus_per_node = this x tasks)."""
    mem_gb_per_rank: float | None = None
    """Memory per rank in GB (None: the partition's default); the job asks tasks x this."""
    timeout_min: int | None = None
    """A fixed time limit in minutes; None (default): startup_s + bench.timeout_s per length."""
    startup_s: float = 300.0
    """Time allowance before the first length; the limit adds bench.timeout_s per length."""
    poll_s: float = 60.0
    """Longest wait between two looks at the jobs' states (sacct; submitit's backs off to 600 s)."""
    srun_args: list[str] = field(default_factory=lambda: ["--kill-on-bad-exit=1"])
    """Extra srun arguments; --kill-on-bad-exit ends every rank when one fails, so a dead
    rank never leaves its peers waiting until the time limit."""
