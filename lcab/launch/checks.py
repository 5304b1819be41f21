"""Pre-flight checks of a SLURM sweep: what can be known wrong before anything is submitted.

Each problem names the key, the value and what would be valid (exit 2 before submitting):
``sbatch`` missing, ``topology=auto`` (it would count the login node's GPUs), bad CP degrees,
Ulysses groups spanning nodes, an unknown or too small partition. A scheduler's refusal becomes
a record per cell.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from lcab.cell import Cell
from lcab.config.launcher import LAUNCHER_TARGET
from lcab.distributed.context import binding_problem
from lcab.launch.refusals import layout_problems
from lcab.launch.slurm_launcher import composed_settings
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def uses_slurm(cfg: DictConfig) -> bool:
    """Whether a config (composed with its ``hydra`` node) launches on SLURM via lcab."""
    return OmegaConf.select(cfg, "hydra.launcher._target_", default=None) == LAUNCHER_TARGET


@cache
def partitions() -> dict[str, int] | None:
    """Nodes per partition (the default one also under ``""``), or None if sinfo fails."""
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P %D"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    nodes: dict[str, int] = {}
    for line in out.splitlines():
        name, count = line.split()
        default = name.endswith("*")
        name = name.rstrip("*")
        nodes[name] = nodes.get(name, 0) + int(count)
        if default:
            nodes[""] = nodes[name]
    return nodes


def slurm_problems(cfg: DictConfig, cell: Cell) -> list[str]:
    """Why this job cannot be submitted as it is (empty: it can): a single run's check.

    A sweep checks only `submission_problems`: one cell its strategy cannot lay out on the
    SLURM topology must not refuse the rest (it ends ``skipped``).
    """
    layout = layout_problems(cell, str(cfg.topology.name)) if uses_slurm(cfg) else []
    return submission_problems(cfg, cell) + layout


def submission_problems(cfg: DictConfig, cell: Cell) -> list[str]:
    """What stops the job being submitted or started at all (empty: nothing).

    A local CUDA job is checked too: all its ranks share this host's visible GPUs.
    """
    if not uses_slurm(cfg):
        local = None
        if cell.device == "cuda" and cell.cp != "none":
            local = binding_problem(cell.world_size, torch.cuda.device_count(), cell.backend)
        return [] if local is None else [f"topology={cfg.topology.name}: {local}"]
    if shutil.which("sbatch") is None and not cfg.dry_run:  # a dry run may plan anywhere
        return [
            "launcher=slurm needs SLURM's sbatch on PATH, and it is not there; run on a login "
            "node, or try the local test cluster: bash launchers/slurm_local.sh up"
        ]
    problems = []
    if cell.cp != "none" and OmegaConf.select(cfg, "topology.devices_per_node") is None:
        problems.append(
            f"topology={cfg.topology.name} leaves devices_per_node to this machine; under "
            "launcher=slurm name the ranks per node (e.g. topology=2x8 or "
            "topology.devices_per_node=8)"
        )
    settings = composed_settings(cfg)
    known = partitions()
    if known is not None:
        part = settings.partition or ""
        if part not in known:
            valid = ", ".join(sorted(p for p in known if p)) or "none"
            problems.append(f"hydra.launcher.partition={part!r} is unknown; valid: {valid}")
        elif cell.nodes > known[part]:
            problems.append(
                f"topology={cfg.topology.name} needs {cell.nodes} nodes; partition "
                f"{part or '(default)'} has {known[part]}"
            )
    return problems
