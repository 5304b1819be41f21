"""What a record says about where it ran: versions, device, threads, host, git, SLURM."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lcab
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


@cache
def git_state() -> tuple[str | None, bool | None]:
    """(commit sha, has uncommitted changes) of the lcab checkout, or (None, None)."""
    root = Path(lcab.__file__).resolve().parent.parent
    git = ("git", "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    try:
        done = subprocess.run(git, cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None, None
    lines = done.stdout.splitlines()
    sha = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if done.returncode != 0 or sha is None or sha == "(initial)":
        return None, None
    return sha, any(not line.startswith("#") for line in lines)


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
    """NCCL's version torch was compiled with (``2.21.5``), or None; see `loaded_nccl_versions`."""
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version) if version else None


_LIBNCCL = re.compile(r"libnccl\.so(\.\d+)*")


def loaded_nccl_versions(maps: str = "/proc/self/maps") -> str | None:
    """``ncclGetVersion`` of each libnccl mapped into this process (``2.27.3``), or None.

    torch loads NCCL dynamically from the ``nvidia-nccl-cu*`` wheel (``_preload_cuda_deps``), so
    another wheel or ``LD_LIBRARY_PATH`` changes it: the library is found in ``/proc/self/maps``
    and asked with ``RTLD_NOLOAD``. Several versions are all named, lowest first.
    """
    paths = [p for p in mapped_files(maps) if _LIBNCCL.fullmatch(os.path.basename(p))]
    versions = {v for v in map(_ask_version, paths) if v is not None}
    ordered = sorted(versions, key=lambda v: tuple(int(part) for part in v.split(".")))
    return ",".join(ordered) or None


def mapped_files(maps: str = "/proc/self/maps") -> list[str]:
    """The files mapped into this process (its loaded libraries), once each; empty without /proc."""
    try:
        with open(maps) as f:
            fields = [line.split(maxsplit=5) for line in f.read().splitlines()]
    except OSError:
        return []
    return list(dict.fromkeys(f[5].strip() for f in fields if len(f) == 6 and f[5][:1] == "/"))


def kernel_provenance(package: str | None, maps: str = "/proc/self/maps") -> dict[str, Any]:
    """``kernel_package_version`` and ``kernel_binary`` of a kernel that calls ``package``.

    Each shared object of the providing distribution(s) that the process really mapped is hashed
    (sha256), so a rebuilt extension under the same version shows. Empty for torch's own.
    """
    if package is None:
        return {}
    loaded = {os.path.realpath(p) for p in mapped_files(maps)}
    inside = package.replace(".", "/")  # flash_attn.cute: flash-attn-4's, not flash-attn's
    top = package.split(".")[0]
    versions, binaries = [], {}
    for name in dict.fromkeys(importlib.metadata.packages_distributions().get(top, [])):
        dist = importlib.metadata.distribution(name)
        if not any(str(f).startswith((f"{inside}/", f"{inside}.")) for f in dist.files or ()):
            continue
        versions.append(f"{name} {dist.version}")
        for file in dist.files or ():
            path = os.path.realpath(str(file.locate()))
            if path in loaded:
                binaries[file.name] = _digest(path, os.stat(path).st_mtime_ns)
    return {
        "kernel_package_version": ", ".join(versions) or None,
        "kernel_binary": binaries or None,
    }


@cache
def _digest(path: str, mtime_ns: int) -> str:
    """sha256 of a file's contents, first 16 hex digits (once per process and version)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def driver_version(proc: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA kernel module's version (``550.54.15``) as the driver reports it, or None."""
    try:
        with open(proc) as f:
            found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def _ask_version(path: str) -> str | None:
    """The version ``ncclGetVersion`` of the already loaded library at ``path`` reports."""
    import ctypes

    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        get = lib.ncclGetVersion
    except (OSError, AttributeError):
        return None
    get.argtypes = [ctypes.POINTER(ctypes.c_int)]
    get.restype = ctypes.c_int
    code = ctypes.c_int(0)
    if get(ctypes.byref(code)) != 0 or code.value <= 0:
        return None
    return _version_text(code.value)


def _version_text(code: int) -> str:
    """NCCL's version code (``nccl.h``: major*10000 from 2.9 on, major*1000 before) as text."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


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
        "nccl_version_loaded": loaded_nccl_versions(),
        "torch_build": torch.version.git_version,
        "cudnn_version": str(cudnn) if (cudnn := torch.backends.cudnn.version()) else None,
        "driver_version": driver_version(),
        "device_name": device_name(device),
        "num_threads": torch.get_num_threads(),
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "slurm_tasks": int(os.environ["SLURM_NTASKS"]) if "SLURM_NTASKS" in os.environ else None,
    }
