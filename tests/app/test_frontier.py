"""``seqlen=frontier`` under real memory limits: probes that really run out, a search that goes on.

Two limits as they come: ``bench.memory_budget_gib`` (each rank's ``RLIMIT_DATA``: an
allocation fails and the pass raises) and a memory cgroup made for the test (the kernel's
out-of-memory killer SIGKILLs a rank). Each ends the probe ``oom``; the cell ends with one
record whose bracket holds the limit to the search's resolution.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.memory_cgroup import memory_cgroup

RESOLUTION = 4
FAST = [
    "mask=causal",
    "seqlen=frontier",
    f"seqlen.frontier_resolution={RESOLUTION}",  # a coarser bracket: fewer probes in CI
    "bench.passes=[fwd]",
    "bench.reps=1",
    "bench.warmup=0",
    "bench.mask_samples=1",
    "bench.progress=false",
]


def _frontier(tmp_path: Path, *overrides: str, prefix: list[str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [
            *(prefix or []),
            sys.executable,
            "-m",
            "lcab.main",
            *FAST,
            *overrides,
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 1  # one record per cell, whatever the probes
    return json.loads(lines[0])


def _bracket_holds(record: dict[str, Any], world: int) -> tuple[int, int]:
    fits, fails = record["frontier_bracket"]
    assert record["status"] == "ok"
    assert record["seqlen"] == record["frontier_tokens"] == fits
    assert record["frontier_tokens_per_device"] == fits // world
    assert fails is not None and fails - fits <= max(128 * world, fits // RESOLUTION)
    for probe in record["frontier_probes"]:  # memory grows with length: the bracket splits them
        assert probe["seqlen"] % (128 * world) == 0
        assert probe["status"] == ("ok" if probe["seqlen"] <= fits else "oom"), probe
    assert record["frontier_peak_mib"] == max(record[p]["mem_peak_mib"] for p in record["passes"])
    return fits, fails


def test_a_rank_budget_ends_probes_as_oom_and_the_search_finds_its_frontier(
    tmp_path: Path,
) -> None:
    record = _frontier(tmp_path, "kernel=ranges", "bench.memory_budget_gib=0.2")
    _bracket_holds(record, 1)
    failed = [p for p in record["frontier_probes"] if p["status"] == "oom"]
    assert failed and all("allocate memory" in p["reason"] for p in failed)
    assert record["frontier_budget_gib"] == 0.2
    assert record["numerics_mode"] is None  # probes run without the fp64 reference


def test_ring_at_four_ranks_searches_in_tokens_per_device(tmp_path: Path) -> None:
    record = _frontier(
        tmp_path, "kernel=ranges", "cp=ring", "topology=local4", "bench.memory_budget_gib=0.1"
    )
    fits, _ = _bracket_holds(record, 4)
    assert record["frontier_probes"][0]["seqlen"] == 4 * 1024  # the preset starts at 1K/device
    assert record["world_size"] == 4 and fits % 4 == 0


def test_a_rank_the_cgroup_kills_is_an_oom_probe_not_the_end(tmp_path: Path) -> None:
    with memory_cgroup(int(0.6 * 2**30)) as inside:
        record = _frontier(tmp_path, "kernel=ranges", prefix=inside)
    _bracket_holds(record, 1)
    killed = [p for p in record["frontier_probes"] if p["status"] == "oom"]
    assert killed and all("SIGKILL" in p["reason"] for p in killed)
    assert all("the memory cgroup counted a kill" in p["reason"] for p in killed)  # evidence
    # no bench.memory_budget_gib: the planner's budget is the cgroup's limit, not the host's RAM
    assert record["frontier_budget_gib"] is None
    # the cgroup's limit less what lcab.main (torch imported) already holds there
    assert 0.1 < record["frontier_predicted_budget_gib"] < 0.6
    assert "memory cgroup" in record["frontier_budget_limit"]
    assert "less the" in record["frontier_budget_limit"]
    # the host's RAM put it ~100x too long; the cgroup's limit within a small factor (the
    # supervising process and the forkserver share it; 20,480 both, 2-core VM, 2026-12-07)
    assert record["frontier_predicted_ratio"] > 0.25
