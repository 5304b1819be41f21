"""Under CP a mask construction that fails on one rank is the same error record on every rank.

Before, the failing rank recorded its error and left the length while its peers walked on into
the next collective (the pass checks' gather), so they paired with the failing rank's collective
of the next length, or waited until the time-out. Here rank 1 alone fails to build the first
length's mask (a host ``MemoryError``, injected); every rank must come back with one record
per length, within the launch's deadline (a hang is a ``timeout``), the first an ``error``
naming rank 1 and its error, the second measured as usual (the ranks stayed in step).
"""

from __future__ import annotations

from typing import Any

import pytest

from lcab.cell import Cell, JobInfo
from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

LENGTHS = [256, 512]


def rank_main(rank: int, world: int, rendezvous: str, messages: Any, cell: Cell) -> None:
    import torch

    torch.set_num_threads(1)
    import lcab.bench.masking as masking
    from lcab.bench.environment import environment
    from lcab.bench.runner import run_seqlen
    from lcab.bench.targets import make_target

    target = make_target(cell, rank, rendezvous)
    if rank == 1:
        real = masking.make_mask

        def failing(name: str, seqlen: int, **kwargs: Any) -> Any:
            if seqlen == LENGTHS[0]:
                raise MemoryError("injected: no host memory for the mask")
            return real(name, seqlen, **kwargs)

        masking.make_mask = failing
    env = environment(cell.device)
    for seqlen in cell.seqlens:
        record = run_seqlen(cell, target, seqlen, env)
        messages.put(("record", rank, record.to_dict()))
    target.close()


def _cell(compose: Any, tmp_path: Any, world: int) -> Cell:
    from lcab.config import resolve_cell

    cfg = compose(
        [
            "kernel=ranges",
            "cp=ring",
            f"topology=local{world}",
            "mask=causal",
            f"seqlen.values=[{LENGTHS[0]},{LENGTHS[1]}]",
            "bench=quick",
            "bench.passes=[fwd]",
            "bench.timeout_s=60",
            "problem.device=cpu",
        ]
    )
    return resolve_cell(cfg, JobInfo(output_dir=str(tmp_path), run_id="m-0", sweep_id="m"))


@pytest.mark.parametrize("world", [2, 4])
def test_a_mask_failing_on_one_rank_is_every_rank_s_error_and_nobody_hangs(
    compose, tmp_path, world
):
    cell = _cell(compose, tmp_path, world)
    assert cell.world_size == world
    got: list[tuple[Any, ...]] = []

    def on_message(msg: tuple[Any, ...]) -> float:
        got.append(msg)
        return 60.0

    result = launch(rank_main, world, (cell,), 60.0, on_message, tmp_path)
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for _, rank, record in got:
        by_rank.setdefault(rank, []).append(record)
    assert sorted(by_rank) == list(range(world))
    for rank, records in by_rank.items():
        assert [r["seqlen"] for r in records] == LENGTHS, rank
        failed, measured = records
        assert failed["status"] == "error", (rank, failed)
        assert failed["error_type"] == "MemoryError"
        assert "injected: no host memory" in failed["error_msg"]
        assert any(f"failed on rank 1 of {world}" in r for r in failed["reasons"]), failed
        assert measured["status"] == "ok", (rank, measured["reasons"])
    firsts = [{k: r[0][k] for k in ("status", "error_type", "error_msg")} for r in by_rank.values()]
    assert all(first == firsts[0] for first in firsts)  # the same record on every rank
