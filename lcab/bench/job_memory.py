"""The memory a job may really use, and whether the out-of-memory killer ended a rank.

The limits: the memory cgroup (SLURM's ``--mem``, containers; the smallest along its
ancestors), the host's available memory, a GPU's free memory (through NVML: no CUDA context).
The cgroup's ``oom_kill`` count (else ``/proc/vmstat``'s) tells a SIGKILL was the OOM killer.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MEMINFO = Path("/proc/meminfo")
PROC_VMSTAT = Path("/proc/vmstat")


def memory_cgroup(proc: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> tuple[Path, Path] | None:
    """(The memory cgroup folder of this process, its hierarchy's mount), or None without one."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if number == "0" and "memory" in _read(root / "cgroup.controllers").split():
            mount = root  # v2: one hierarchy
        elif "memory" in controllers.split(","):
            mount = root / "memory"  # v1: the memory controller's own
        else:
            continue
        folder = mount / path.lstrip("/")
        # a container with a cgroup namespace mounts its own cgroup at the root
        return (folder if folder.is_dir() else mount), mount
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cgroup_room(proc: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> tuple[int, Path, int] | None:
    """(The smallest limit along the cgroup's ancestors, its file, what that cgroup holds now).

    What it holds is its working set, as ``docker stats`` counts it (usage less inactive page
    cache); the supervisor keeps it while ranks run (a 0.75 GiB job planned on its whole limit
    measured 0.45 of the predicted frontier).
    """
    found = memory_cgroup(proc, root)
    if found is None:
        return None
    folder, mount = found
    limits = []
    for at in (folder, *folder.parents):
        for name, usage, cache in _FILES:
            text = _read(at / name).strip()
            if text.isdigit():
                held = _number(_read(at / usage)) - _stat(at / "memory.stat", cache)
                limits.append((int(text), at / name, max(held, 0)))
        if at == mount:
            break
    return min(limits) if limits else None


_FILES = (
    ("memory.max", "memory.current", "inactive_file"),  # v2
    ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),  # v1
)
"""Per cgroup version: the limit's file, the usage's, and memory.stat's reclaimable cache key."""


def _number(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def _stat(path: Path, key: str) -> int:
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _number(value)
    return 0


def oom_kills(proc: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int | None:
    """Out-of-memory kills counted in this process's cgroup, else on the host (None: no count)."""
    found = memory_cgroup(proc, root)
    files = [found[0] / "memory.events", found[0] / "memory.oom_control"] if found else []
    for path in [*files, PROC_VMSTAT]:
        for line in _read(path).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def host_available() -> int | None:
    """Bytes the host can still give (``MemAvailable``; None: not Linux)."""
    for line in _read(PROC_MEMINFO).splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _gpu_free(ranks: int) -> tuple[int, int] | None:
    """(The least free memory of the GPUs ``ranks`` local ranks use, how many use each one)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no binding, no driver: nothing to read
        return None
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = visible.split(",") if visible else map(str, range(pynvml.nvmlDeviceGetCount()))
        handles = [
            pynvml.nvmlDeviceGetHandleByIndex(int(n))
            if n.strip().isdigit()
            else pynvml.nvmlDeviceGetHandleByUUID(n.strip())
            for n in list(names)[:ranks]
        ]
        free = min(pynvml.nvmlDeviceGetMemoryInfo(h).free for h in handles)
        return free, math.ceil(ranks / len(handles))
    except (pynvml.NVMLError, ValueError):
        return None
    finally:
        pynvml.nvmlShutdown()


def job_budget(device: str, ranks: int) -> tuple[float, str] | None:
    """GiB each of this node's ``ranks`` ranks may use, and which limit gave it (None: none read).

    CUDA: the fullest GPU's free memory; CPU: the smaller of the cgroup's room and the host's.
    """
    limits: list[tuple[float, str]] = []
    if device == "cuda":
        gpu = _gpu_free(ranks)
        if gpu is not None:
            limits.append((gpu[0] / gpu[1], f"the GPU's free memory / {gpu[1]} rank(s)"))
    else:
        room = cgroup_room()
        if room is not None:
            limit, path, held = room
            what = f"the memory cgroup's {path} less the {held / 2**30:.2f} GiB it holds"
            limits.append(((limit - held) / ranks, f"{what} / {ranks} rank(s)"))
        available = host_available()
        if available is not None:
            limits.append((available / ranks, f"the host's MemAvailable / {ranks} rank(s)"))
    if not limits:
        return None
    size, source = min(limits)
    return size / 2**30, source
