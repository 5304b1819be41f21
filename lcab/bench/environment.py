"""What a record says about where it ran: versions, device, threads, host, git, SLURM."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import torch

import lcab


@cache
def git_state() -> tuple[str | None, bool | None]:
    """(commit sha, has uncommitted changes) of the lcab checkout, or (None, None)."""
    root = Path(lcab.__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return None, None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return sha.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def device_name(device: str) -> str:
    """GPU name, or the CPU model."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def nccl_version() -> str | None:
    """NCCL's version as torch was built with it (``2.21.5``), or None without NCCL."""
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version) if version else None


def environment(device: str) -> dict[str, Any]:
    """Record fields describing the environment."""
    sha, dirty = git_state()
    return {
        "lcab_version": lcab.__version__,
        "git_sha": sha,
        "git_dirty": dirty,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": nccl_version(),
        "device_name": device_name(device),
        "num_threads": torch.get_num_threads(),
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "slurm_tasks": int(os.environ["SLURM_NTASKS"]) if "SLURM_NTASKS" in os.environ else None,
    }
