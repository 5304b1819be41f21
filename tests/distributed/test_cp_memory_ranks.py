"""Under CP a pass's memory figure is the largest over ranks, and names the rank that holds it.

Rank 0's own reading (what records held before) hides the rank that runs out first. Here each
rank of a gloo world reports a different (seamed) reading and every rank must get the same
answer: the largest peak, that rank's baseline, the largest reserved figure, and the largest
delta of any rank — which here is not the peak rank's (its inputs are large, its kernel small).
"""

from __future__ import annotations

from typing import Any

import pytest

from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]

MIB = 2**20
PEAKS = [300, 900, 500]  # MiB per rank: rank 1 holds the peak
BASELINES = [10, 700, 50]  # MiB: deltas 290, 200, 450 -> the largest is rank 2's, not rank 1's
RESERVED = [1000, 950, 1200]  # MiB: the largest reserved is rank 2's


def rank_main(rank: int, world: int, rendezvous: str, messages: Any) -> None:
    from lcab.bench.memory import MemoryReading
    from lcab.bench.targets import CPTarget
    from lcab.distributed.context import DistContext

    ctx = DistContext.start_local(rank, world, world, "gloo", rendezvous, 60)
    target = object.__new__(CPTarget)  # `largest_reading` needs only the group
    target.dist, target.rank, target.world = ctx, rank, world
    mine = MemoryReading(
        PEAKS[rank] * MIB, BASELINES[rank] * MIB, "cuda_max_allocated", RESERVED[rank] * MIB
    )
    got = target.largest_reading(mine)
    messages.put(("reading", rank, got))
    ctx.close()


def test_every_rank_gets_the_largest_peak_its_rank_the_largest_delta_and_reserved(tmp_path):
    got: list[tuple[Any, ...]] = []

    def on_message(msg: tuple[Any, ...]) -> float:
        got.append(msg)
        return 60.0

    result = launch(rank_main, 3, (), 60.0, on_message, tmp_path)
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    readings = [m[2] for m in sorted(got, key=lambda m: m[1])]
    assert len(readings) == 3 and len(set(readings)) == 1
    reading = readings[0]
    assert reading.rank == 1 and reading.peak_bytes == 900 * MIB
    assert reading.baseline_bytes == 700 * MIB  # rank 1's own baseline
    deltas = [peak - base for peak, base in zip(PEAKS, BASELINES, strict=True)]
    assert reading.delta_bytes == max(deltas) * MIB == 450 * MIB  # rank 2's, not the peak's
    assert reading.reserved_bytes == 1200 * MIB
