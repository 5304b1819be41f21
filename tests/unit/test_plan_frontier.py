"""The planner's frontier against its memory model, by hand."""

from __future__ import annotations

import pytest

from lcab.plan.frontier import predict_frontier, rank_memory_mib
from lcab.plan.memory import MIB
from lcab.plan.predict import PlanCell


def _cell(cp: str, nodes: int = 1, per_node: int = 1, seqlen: int = 1024) -> PlanCell:
    return PlanCell(cp, "fa3", "causal", seqlen, nodes, per_node, 64, 8, 128, "bfloat16")


def test_one_device_holds_its_eight_tensors() -> None:
    # bf16: q, out (64 heads) and k, v (8 heads) of 128 dims, doubled by dout, dq, dk, dv
    per_token = 2 * 128 * 2 * (64 + 8)
    assert rank_memory_mib(_cell("none", seqlen=4096), True) == pytest.approx(
        2 * 4096 * per_token / MIB
    )
    budget_mib = 1024.0
    found = predict_frontier(_cell("none"), budget_mib, True, 1 << 24, 16)
    limit = budget_mib * MIB / (2 * per_token)  # tokens the budget holds, by hand
    assert found.tokens is not None and found.tokens <= limit
    assert found.bracket[1] is not None and found.bracket[1] > limit
    assert found.bracket[1] - found.tokens <= max(128, found.tokens // 16)


def test_a_ring_rank_holds_a_shard_so_its_frontier_grows_with_the_world() -> None:
    one = predict_frontier(_cell("ring", 1, 8, 8 * 1024), 8192.0, True, 1 << 26, 16)
    two = predict_frontier(_cell("ring", 2, 8, 16 * 1024), 8192.0, True, 1 << 26, 16)
    assert one.tokens is not None and two.tokens is not None
    # the same memory per rank: twice the ranks hold about twice the tokens
    assert two.tokens / one.tokens == pytest.approx(2.0, rel=0.1)
    assert one.memory_mib is not None and one.memory_mib <= 8192.0


def test_a_strategy_that_cannot_run_the_cell_says_why() -> None:
    with pytest.raises(ValueError, match="Ulysses"):
        predict_frontier(_cell("ulysses", 12, 8, 96 * 1024), 8192.0, True, 1 << 26, 16)
