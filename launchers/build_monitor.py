"""Run a build command and measure it: wall time, and the peak memory of its whole process tree.

    python build_monitor.py REPORT.json -- COMMAND [ARGS...]

``/usr/bin/time``'s maximum RSS is that of the largest single process; what decides whether a
build fits a machine is the sum over every process alive at once (two nvcc front ends and their
``cicc``/``ptxas`` children under ``MAX_JOBS=2``). The tree is sampled every half second from
``/proc`` (a peak shorter than that can be missed: the figure is a lower bound, said in the
report). Beside the wall time: the CPU time of every process of the tree (``getrusage`` of the
waited children: a figure other work on the machine changes less than the wall time) and the
1-minute load average before and after (other work on the machine shows there). The command's
own output passes through; its exit status is this script's.
Standard library only: it runs under whichever Python starts the build.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
INTERVAL_S = 0.5


def children_of() -> dict[int, list[int]]:
    """Every live process's children, read from ``/proc/*/stat``."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # ended while we looked
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def resident_bytes(pid: int) -> int:
    """A process's resident set (0 once it has ended)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_sample(root: int) -> tuple[int, int, int]:
    """(summed RSS, largest single RSS, processes) of ``root`` and every descendant now."""
    tree, total, largest, count = children_of(), 0, 0, 0
    stack = [root]
    while stack:
        pid = stack.pop()
        rss = resident_bytes(pid)
        total, largest, count = total + rss, max(largest, rss), count + 1
        stack.extend(tree.get(pid, ()))
    return total, largest, count


def main(argv: list[str]) -> int:
    """Run ``argv[2:]`` under the sampler, write the report to ``argv[0]``; its exit status."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: build_monitor.py REPORT.json -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    report, command = Path(argv[0]), argv[2:]
    start, load_before = time.monotonic(), os.getloadavg()[0]
    process = subprocess.Popen(command)
    peak_total = peak_single = peak_processes = 0
    while process.poll() is None:
        total, single, count = tree_sample(process.pid)
        peak_total, peak_single = max(peak_total, total), max(peak_single, single)
        peak_processes = max(peak_processes, count)
        time.sleep(INTERVAL_S)
    wall = time.monotonic() - start
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    report.write_text(
        json.dumps(
            {
                "wall_s": round(wall, 1),
                "cpu_s": round(used.ru_utime + used.ru_stime, 1),
                "load_before": round(load_before, 2),
                "load_after": round(os.getloadavg()[0], 2),
                "peak_tree_rss_mib": round(peak_total / 2**20),
                "peak_process_rss_mib": round(peak_single / 2**20),
                "peak_processes": peak_processes,
                "sampled_every_s": INTERVAL_S,
                "exit_status": process.returncode,
            },
            indent=1,
        )
    )
    return process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
