"""The numerics check of a CP cell costs rank 0 what its own shard costs, not what the world does.

Issue 32's done-when: at the same tokens per rank, rank 0's peak memory for the check (its
inputs drawn from the seed, the untimed call, the results brought to rank 0, the fp64
reference) must not grow with the world size. Before, every rank drew the global q/k/v/dout
and rank 0 repeated the global K/V per query head: at world 8 that is 4x world 2's inputs.

The check here is the runner's own composition (`SeededInputs.shard`, `run_check` with the
CP collector, `Reference` on rank 0, `compare`), measured with the runner's `PeakMemory` on
rank 0, on gloo. The results must also pass the fp64 tolerance, so a check that skipped its
work could not look cheap.
"""

from __future__ import annotations

from typing import Any

import pytest

from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

TOKENS_PER_RANK = 16384
HEADS, HEAD_DIM = 8, 64
ROWS = 32
MIB = 2**20


def shard_bytes() -> int:
    """fp32 bytes of one rank's q (or dout) shard."""
    return TOKENS_PER_RANK * HEADS * HEAD_DIM * 4


def rank_main(rank: int, world: int, rendezvous: str, messages: Any) -> None:
    import torch

    torch.set_num_threads(1)
    from lcab.bench.inputs import SeededInputs
    from lcab.bench.memory import PeakMemory
    from lcab.bench.numerics import Reference, compare, run_check
    from lcab.cp import STRATEGIES
    from lcab.distributed.context import DistContext
    from lcab.kernels import Problem, get_kernel
    from lcab.kernels.reference import sample_rows
    from lcab.masks import make_mask

    ctx = DistContext.start_local(rank, world, world, "gloo", rendezvous, 300)
    seqlen = TOKENS_PER_RANK * world
    mask = make_mask("sliding_window_causal", seqlen, seed=0, window=16)
    problem = Problem(seqlen, seqlen, HEADS, HEADS, HEAD_DIM, torch.float32)
    # a ring: every buffer of the call itself is shard-sized too (Ulysses would hold the
    # whole sequence for a share of the heads, and its kernel's mask metadata grows with it)
    strategy = STRATEGIES.get("ring")({"balance": "contiguous"}, world)
    plan = strategy.plan(mask, problem, world)
    prepared = strategy.build(plan, mask, problem, get_kernel("ranges"), ctx)
    rows = sample_rows(seqlen, ROWS, seed=1)
    ctx.barrier()
    with PeakMemory(torch.device("cpu")) as memory:
        source = SeededInputs(7, seqlen, 0, problem)
        native = {n: source.shard(n, prepared.tokens) for n in ("q", "k", "v", "dout")}
        reference = Reference(mask, source, rows) if rank == 0 else None
        errors: dict[str, float] = {}
        for pass_ in ("fwd", "bwd"):
            results = run_check(pass_, prepared, native, rows, prepared)
            if reference is not None:
                assert results is not None
                errors |= compare(results, reference)
        del native, reference
    ctx.barrier()
    if rank == 0:
        messages.put(("peak", memory.reading.delta_bytes, errors))
    ctx.close()


def _rank0_check(world: int, tmp_path: Any) -> tuple[int, dict[str, float]]:
    got: list[tuple[int, dict[str, float]]] = []

    def on_message(msg: tuple[Any, ...]) -> float:
        got.append((msg[1], msg[2]))
        return 300.0

    result = launch(rank_main, world, (), 300.0, on_message, tmp_path / f"w{world}")
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    assert len(got) == 1
    return got[0]


def test_rank0_check_memory_follows_the_shard_not_the_world(tmp_path):
    peak2, errors2 = _rank0_check(2, tmp_path)
    peak8, errors8 = _rank0_check(8, tmp_path)
    for errors in (errors2, errors8):
        assert set(errors) == {"out", "lse", "dq"}  # sampled mode: the rows (no dk, dv)
        assert max(errors.values()) <= 1e-3, errors  # fp32 tolerance
    # world 8 holds 4x the tokens of world 2: one global fp32 q alone grows by 3 shards
    # (96 MiB), the old four global inputs by 12; the shard-bound check grows by neither (the
    # margin of two shards covers the O(S) integer row intervals of the mask and RSS noise)
    growth = peak8 - peak2
    assert growth < 2 * shard_bytes(), (
        f"rank 0's check peak grew {growth / MIB:.0f} MiB from world 2 ({peak2 / MIB:.0f} MiB)"
        f" to world 8 ({peak8 / MIB:.0f} MiB); one shard is {shard_bytes() / MIB:.0f} MiB"
    )
    assert peak2 >= 2 * shard_bytes()  # it did draw its shards (a reading that sees memory)
    print(f"rank 0 check peak: world 2 {peak2 / MIB:.0f} MiB, world 8 {peak8 / MIB:.0f} MiB")
