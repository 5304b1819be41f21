"""A memory cgroup made for one test: a real limit the kernel enforces by killing a process.

A frontier search must survive the host running out of memory, which does not raise: the
kernel's out-of-memory killer SIGKILLs a process. A test makes that happen for real inside a
cgroup of its own (v2 ``memory.max``, or v1 ``memory.limit_in_bytes``), runs its command in it
and removes it afterwards. Needs root and a mounted memory controller; otherwise the test is
skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path("/sys/fs/cgroup")


def _parent() -> tuple[Path, str, str]:
    """(folder to make the group in, limit file, process list file)."""
    controllers = ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return ROOT, "memory.max", "cgroup.procs"
    if (ROOT / "memory" / "memory.limit_in_bytes").exists():
        return ROOT / "memory", "memory.limit_in_bytes", "cgroup.procs"
    raise FileNotFoundError("no cgroup memory controller under /sys/fs/cgroup")


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[list[str]]:
    """A fresh cgroup limited to ``limit_bytes``; yields a command prefix that runs in it."""
    if os.geteuid() != 0:
        pytest.skip("a memory cgroup needs root")
    try:
        parent, limit_file, procs = _parent()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    group = parent / f"lcab-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit_bytes))
        swap = group / "memory.memsw.limit_in_bytes"  # v1: no escape into swap
        if swap.exists():
            with contextlib.suppress(OSError):
                swap.write_text(str(limit_bytes))
        if (group / "memory.swap.max").exists():  # v2
            (group / "memory.swap.max").write_text("0")
    except OSError as err:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {err}")
    shell = shutil.which("sh") or "/bin/sh"
    try:
        yield [shell, "-c", f'echo $$ > {group / procs} && exec "$@"', "sh"]
    finally:
        leftover = group / procs
        if leftover.exists():
            for pid in leftover.read_text().split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
        for _ in range(50):  # the kernel frees the group once its last process is reaped
            try:
                group.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)
