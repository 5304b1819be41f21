"""The planner's frontier against its memory model, by hand."""

from __future__ import annotations

import dataclasses

import pytest

from lcab.cp.hybrid import ring_steps
from lcab.kernels import get_kernel
from lcab.plan.frontier import predict_frontier, rank_memory_mib
from lcab.plan.hardware import Hardware, KernelMemory, load_profile
from lcab.plan.memory import MIB, dense_positions, whole_dense_positions
from lcab.plan.predict import PlanCell, mask_for, predict, strategy_for
from lcab.plan.recommend import recommend


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


# ------------------------------------------------------- the profile's kernel memory terms
def _profile(**terms: float) -> Hardware:
    base = load_profile("cpu_gloo_local")
    memory = {"sdpa": KernelMemory(**terms), "ranges": KernelMemory(**terms)}
    return dataclasses.replace(base, kernel_memory=memory, memory_margin=0.0)


def _cpu_cell(cp: str, kernel: str, mask: str, seqlen: int, world: int = 1) -> PlanCell:
    return PlanCell(cp, kernel, mask, seqlen, 1, world, 8, 2, 64, "float32")


def test_the_kernel_terms_add_fixed_per_token_and_dense_mask_memory_by_hand() -> None:
    hardware = _profile(fixed_mib=100.0, q_bytes=12.0, dense_bytes=4.0)
    seqlen = 2048
    tensors = rank_memory_mib(_cpu_cell("none", "sdpa", "causal", seqlen), True)
    q_elements = seqlen * 8 * 64
    # causal runs as is_causal: no dense mask
    causal = rank_memory_mib(_cpu_cell("none", "sdpa", "causal", seqlen), True, hardware)
    assert causal == pytest.approx(tensors + 100.0 + 12.0 * q_elements / MIB)
    # a document mask is a dense (1, 1, S, S) float32 bias for sdpa (4 bytes a position) and
    # the profile's 4 more at its peak; nothing for lcab's ranges
    document = rank_memory_mib(_cpu_cell("none", "sdpa", "causal_document", seqlen), True, hardware)
    assert document == pytest.approx(causal + (4 + 4.0) * seqlen * seqlen / MIB)
    ranges = rank_memory_mib(_cpu_cell("none", "ranges", "causal_document", seqlen), True, hardware)
    assert ranges == pytest.approx(causal)


def _biases_the_ring_holds(cell: PlanCell) -> tuple[float, float]:
    """Elements of the dense biases lcab's sdpa kernel builds for the ring's own prepared steps
    (lcab.cp.hybrid.ring_steps with the real kernel): the fullest rank's sum, and its largest."""
    strategy, mask, problem = strategy_for(cell), mask_for(cell), cell.problem()
    plan = strategy.plan(mask, problem, cell.world)
    kernel = get_kernel("sdpa")
    layouts = list(plan.placement.layouts)
    held = []
    for position in range(plan.ring):
        steps = ring_steps(plan, mask, problem, kernel, position, 0, layouts)
        biases = [getattr(s.prepared, "bias", None) for s in steps if s.prepared is not None]
        held.append([b.numel() for b in biases if b is not None])
    fullest = max(held, key=sum)
    return float(sum(fullest)), float(max(fullest))


@pytest.mark.parametrize("mask", ["causal", "causal_document", "full"])
def test_dense_positions_are_the_biases_the_rings_own_steps_build(mask: str) -> None:
    cell = _cpu_cell("ring", "sdpa", mask, 2048, world=4)
    built, problem = mask_for(cell), cell.problem()
    plan = strategy_for(cell).plan(built, problem, 4)
    expected = _biases_the_ring_holds(cell)
    assert expected[0] > 0  # zigzag chunks: every step's sub-mask has several slices
    assert dense_positions(plan, built) == pytest.approx(expected)


def test_one_device_holds_a_bias_only_where_the_mask_is_not_one_full_or_causal_slice() -> None:
    problem = _cpu_cell("none", "sdpa", "causal", 1024).problem()
    for mask, held in (("causal", 0), ("full", 0), ("causal_document", 1024 * 1024)):
        built = mask_for(_cpu_cell("none", "sdpa", mask, 1024))
        bias = getattr(get_kernel("sdpa").prepare(built, problem), "bias", None)
        assert (0 if bias is None else bias.numel()) == held
        assert whole_dense_positions(built, problem) == (held, held)


def test_a_rank_of_a_world_holds_its_own_fixed_part() -> None:
    cell = _cpu_cell("ulysses", "ranges", "causal", 4096, world=4)
    alike = _profile(fixed_mib=50.0)  # no part of its own: a world of one's
    assert rank_memory_mib(cell, True, alike) == pytest.approx(rank_memory_mib(cell, True) + 50.0)
    own = _profile(fixed_mib=50.0, cp_fixed_mib=30.0)
    assert rank_memory_mib(cell, True, own) == pytest.approx(rank_memory_mib(cell, True) + 30.0)
    alone = _cpu_cell("none", "ranges", "causal", 4096)
    assert rank_memory_mib(alone, True, own) == pytest.approx(rank_memory_mib(alone, True) + 50.0)


def test_the_terms_shrink_the_predicted_frontier_as_the_budget_says() -> None:
    hardware = _profile(fixed_mib=100.0, q_bytes=24.0)
    budget = 300.0
    bare = predict_frontier(_cpu_cell("none", "ranges", "causal", 1024), budget, True, 1 << 20, 16)
    held = predict_frontier(
        _cpu_cell("none", "ranges", "causal", 1024), budget, True, 1 << 20, 16, hardware
    )
    assert bare.tokens is not None and held.tokens is not None
    # per token: the 8 tensors (fp32: 2 x 4 x (2 x 8 + 2 x 2) x 64 bytes) plus 24 B per q element
    per_token = 2 * 4 * 64 * (2 * 8 + 2 * 2) + 24 * 8 * 64
    limit = (budget - 100.0) * MIB / per_token
    assert held.tokens <= limit < held.bracket[1]  # type: ignore[operator]
    assert held.tokens < bare.tokens


def test_a_prediction_and_the_recommendation_count_memory_as_the_frontier_does() -> None:
    hardware = _profile(fixed_mib=40.0, q_bytes=10.0, dense_bytes=6.0, cp_fixed_mib=30.0)
    cell = _cpu_cell("ring", "sdpa", "causal_document", 8192, world=4)
    predicted = predict(cell, hardware)
    assert predicted.memory_mib == pytest.approx(rank_memory_mib(cell, True, hardware))
    assert predicted.memory_terms["dense mask biases"] > 0
    bare = dataclasses.replace(load_profile("cpu_gloo_local"), kernel_memory={})
    assert predicted.memory_mib > predict(cell, bare).memory_mib


def test_the_margin_holds_back_its_share_of_the_budget_from_the_frontier() -> None:
    hardware = dataclasses.replace(_profile(fixed_mib=100.0, q_bytes=24.0), memory_margin=0.25)
    budget = 400.0
    held = predict_frontier(
        _cpu_cell("none", "ranges", "causal", 1024), budget, True, 1 << 20, 16, hardware
    )
    per_token = 2 * 4 * 64 * (2 * 8 + 2 * 2) + 24 * 8 * 64  # as above
    limit = (0.75 * budget - 100.0) * MIB / per_token
    assert held.tokens is not None and held.tokens <= limit < held.bracket[1]  # type: ignore[operator]
    assert held.budget_mib == budget  # the budget as given; the margin is the planner's


def test_the_smallest_world_fits_the_profile_s_memory_less_its_margin() -> None:
    cell = _cpu_cell("ring", "ranges", "causal", 16384, world=2).with_(nodes=2)
    bare = _profile(fixed_mib=100.0, q_bytes=24.0)
    best = recommend(cell, bare).ranked[0].cell
    one, two = (predict(best.with_(nodes=n), bare).memory_mib for n in (1, 2))
    assert two < one
    exact = dataclasses.replace(bare, memory_gib=one / 1024)  # one node fills it exactly
    assert recommend(cell, exact).smallest_fitting_nodes == 1
    held = dataclasses.replace(exact, memory_margin=(1 - two / one) / 2)
    assert recommend(cell, held).smallest_fitting_nodes == 2
