"""How busy the host was while a length ran: load average and CPU time stolen by a hypervisor.

A CPU figure far off the planner's prediction is often a busy host (another job, or a VM's
steal time): each record keeps the 1-minute load average at its length's start and end, the
usable cores and the share of CPU time stolen between, so a reader tells a slow kernel from a
shared machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class LoadSnapshot:
    """The host's load at one instant."""

    load_1min: float | None
    """``os.getloadavg()[0]`` (None where the platform has none)."""
    busy_ticks: int | None
    """CPU time spent in any state but idle and iowait, all CPUs (None: not reported)."""
    steal_ticks: int | None
    """CPU time a hypervisor gave another guest (None: not reported)."""


def cpu_ticks(text: str) -> tuple[int | None, int | None]:
    """(all but idle/iowait, steal) ticks of the ``cpu`` line of a ``/proc/stat`` text.

    Fields as ``proc(5)``; guest time, already in user, is left out; no steal field: None.
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(x) for x in fields[1:9]]
            steal = ticks[7] if len(ticks) >= 8 else None
            return sum(ticks) - ticks[3] - ticks[4], steal
    return None, None


def snapshot() -> LoadSnapshot:
    """The load now (never raises: what cannot be read is None)."""
    try:
        load: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    try:
        busy, steal = cpu_ticks(PROC_STAT.read_text())
    except (OSError, ValueError):
        busy = steal = None
    return LoadSnapshot(load, busy, steal)


def usable_cores() -> int:
    """The cores this process may run on (its affinity; all of them where none is set)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_fields(start: LoadSnapshot, end: LoadSnapshot) -> dict[str, float | int | None]:
    """The record's host-load fields for a length that ran from ``start`` to ``end``."""
    steal = None
    if None not in (start.steal_ticks, end.steal_ticks, start.busy_ticks, end.busy_ticks):
        assert start.steal_ticks is not None and end.steal_ticks is not None  # for mypy
        assert start.busy_ticks is not None and end.busy_ticks is not None
        used = end.busy_ticks - start.busy_ticks
        steal = (end.steal_ticks - start.steal_ticks) / used if used > 0 else 0.0
    return {
        "host_load_start": start.load_1min,
        "host_load_end": end.load_1min,
        "host_cores": usable_cores(),
        "host_steal_share": steal,
    }
