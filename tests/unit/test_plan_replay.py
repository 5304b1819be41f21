"""The planner's replay moves what the runner's plans move and computes what their steps compute.

Expectations come from the runner's own code paths, not from the planner: bytes from
``Strategy.plan(...).comm_bytes`` (the figure the gloo tests prove equal to the measured
traffic), and each call's work from the sub-mask the runner's own build prepares for it, in the
order its forward calls them, whose exact area is counted by the mask engine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lcab.cp import STRATEGIES
from lcab.cp.balance import zigzag as place_zigzag
from lcab.cp.schedule import RecordingContext
from lcab.kernels import PreparedAttention, Problem
from lcab.masks import make_mask
from lcab.masks.remap import remap
from lcab.plan.areas import pair_work
from lcab.plan.replay import replay, zigzag_halves

DOCS = {"doc_source": "uniform", "min_doc_len": 40, "max_doc_len": 300}
MASKS = {
    "causal": lambda s: make_mask("causal", s),
    "causal_document": lambda s: make_mask("causal_document", s, seed=3, **DOCS),
    "share_question": lambda s: make_mask("share_question", s, seed=4, **DOCS),
    "block_sparse": lambda s: make_mask("block_sparse", s, seed=5, block_size=32, heads=4),
}
# (world, devices per node): one node, two nodes, and a world of 6 (non-power of two)
TOPOLOGIES = [(4, 4), (8, 4), (6, 2)]
PROBLEM = Problem(960, 960, 24, 4, 16, torch.float32)


def strategies():
    return [
        (name, balance)
        for name in STRATEGIES.names()
        for balance in (("contiguous",) if name == "ulysses" else ("zigzag", "area"))
    ]


def runnable(name: str, balance: str, world: int, dpn: int):
    strategy = STRATEGIES.get(name)({"balance": balance}, dpn)
    return strategy, strategy.reasons(PROBLEM, world)


@pytest.mark.parametrize(("world", "dpn"), TOPOLOGIES)
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize(("name", "balance"), strategies())
def test_replay_sends_exactly_the_plan_bytes_per_rank(name, balance, mask_name, world, dpn):
    strategy, reasons = runnable(name, balance, world, dpn)
    if reasons:
        pytest.skip("; ".join(reasons))
    mask = MASKS[mask_name](PROBLEM.seqlen_q)
    plan = strategy.plan(mask, PROBLEM, world)
    replayed = replay(strategy, mask, PROBLEM, world, plan)
    want = {op: b for op, b in plan.comm_bytes.items() if b}
    for rank in range(world):
        assert replayed.bytes_by_op(rank) == want, f"rank {rank}"


class AreaCall(PreparedAttention):
    """A call that notes the attended area x local query heads of the sub-mask it was built for."""

    def __init__(self, areas: list, area: int) -> None:
        self.areas, self.area = areas, area

    def run(self, q, k, v):
        self.areas.append(self.area)
        return torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0], dtype=torch.float64)


class AreaKernel:
    """The kernel a strategy's build prepares its sub-masks with (`AreaCall` each)."""

    name = "areas"

    def __init__(self) -> None:
        self.areas: list = []

    def prepare(self, mask, problem):
        return AreaCall(self.areas, mask.area() * problem.heads_q // mask.num_heads)


def runner_step_areas(strategy, plan, mask, rank):
    """The area of each kernel call the runner's forward makes on ``rank``, in order: its real
    build (the sub-masks it prepares) and forward, run through the schedule check's recording
    context (nothing sent)."""
    kernel = AreaKernel()
    context = RecordingContext(rank, plan.world, strategy.devices_per_node, "record")
    prepared = strategy.build(plan, mask, PROBLEM, kernel, context)
    n, d = plan.shard_len, PROBLEM.head_dim
    q, k, v = (torch.zeros(n, h, d, dtype=torch.float64) for h in (24, 4, 4))
    prepared.run(q, k, v)
    return kernel.areas


@pytest.mark.parametrize(("world", "dpn"), TOPOLOGIES)
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize(("name", "balance"), strategies())
def test_replay_work_per_rank_and_step_equals_the_runner_steps(
    name, balance, mask_name, world, dpn
):
    strategy, reasons = runnable(name, balance, world, dpn)
    if reasons:
        pytest.skip("; ".join(reasons))
    mask = MASKS[mask_name](PROBLEM.seqlen_q)
    plan = strategy.plan(mask, PROBLEM, world)
    replayed = replay(strategy, mask, PROBLEM, world, plan)
    d = PROBLEM.head_dim
    for rank in range(world):
        want = runner_step_areas(strategy, plan, mask, rank)
        got = [w.flops / (4 * d) for w in replayed.work(rank, "fwd")]
        assert np.allclose(got, want), (rank, got, want)
        bwd = [w.flops for w in replayed.work(rank, "bwd")]
        assert np.allclose(bwd, [2.5 * 4 * d * a for a in want]), rank


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_pair_work_equals_the_areas_and_rows_of_remapped_sub_masks(mask_name):
    mask = MASKS[mask_name](500)
    rng = np.random.default_rng(0)
    tokens = rng.permutation(500)
    rows = [np.sort(tokens[:170]), np.sort(tokens[170:330]), np.append(np.sort(tokens[330:]), -1)]
    cols = [np.sort(tokens[:250]), np.sort(tokens[250:])]
    work = pair_work(mask, rows, cols)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            for h in range(mask.num_heads):
                sub = remap(mask.head(h), r, c)
                dense = sub.to_dense()
                assert work.area[h, i, j] == dense.sum()
                active = dense.any(1).numpy()
                assert work.rows[h, i, j] == active.sum()
                # cols: key columns some row of the pair attends (the backward's sweeps)
                assert work.cols is not None
                assert work.cols[h, i, j] == dense.any(0).sum()
                # runs: maximal stretches of consecutive active tokens inside one document
                ids = r[r >= 0][active[: (r >= 0).sum()]]
                lengths = [500] if mask.doc_lengths is None else list(mask.doc_lengths)
                doc = np.searchsorted(np.cumsum(lengths), ids, side="right")
                breaks = (np.diff(ids) != 1) | (np.diff(doc) != 0)
                assert work.runs[h, i, j] == (len(ids) > 0) + breaks.sum()
                # per document: attended columns of each, counted off the dense sub-mask
                keys = c[c >= 0][dense.any(0).numpy()[: (c >= 0).sum()]]
                per_doc = np.bincount(
                    np.searchsorted(np.cumsum(lengths), keys, side="right"),
                    minlength=len(lengths),
                )
                assert work.col_docs is not None and work.longest_cols is not None
                assert work.col_docs[h, i, j] == (per_doc > 0).sum()
                assert work.longest_cols[h, i, j] == per_doc.max()


def test_pair_work_counts_shards_too_large_for_16_bit_counts():
    """A 66,000-token shard overflows the uint16 prefix table; the counts widen, exactly."""
    n, a = 70_000, 66_000
    mask = make_mask("causal", n)
    tokens = np.arange(n)
    work = pair_work(mask, [tokens[:a], tokens[a:]], [tokens[:a], tokens[a:]])
    b = n - a
    # hand count: a causal triangle on each diagonal shard, a full rectangle below
    assert work.area[0].tolist() == [[a * (a + 1) // 2, 0], [b * a, b * (b + 1) // 2]]
    assert work.rows[0].tolist() == [[a, 0], [b, b]]
    assert work.cols is not None and work.cols[0].tolist() == [[a, 0], [a, b]]


def test_ring_collectives_cross_each_nic_once_per_remote_node():
    """All-gather over 2 nodes of 4: a rank's NIC carries 1 of the 7 shards it gathers.

    Hand count: NCCL's rings (one per NIC) enter a node once each, so the 4 remote shards a node
    needs cross once, spread over its 4 NICs; an all-to-all instead sends each remote peer its
    own block through the rank's NIC (4 of 7 peers are remote).
    """
    mask = make_mask("causal", 960)
    strategy = STRATEGIES.get("ring_allgather")({"balance": "zigzag"}, 4)
    replayed = replay(strategy, mask, PROBLEM, 8)
    for rank in range(8):
        (gather,) = [t for t in replayed.transfers(rank, "fwd") if t.kind == "allgather"]
        assert gather.inter_bytes == gather.nbytes * 1 // 7
    ulysses = replay(STRATEGIES.get("ulysses")({}, 4), mask, Problem(960, 960, 8, 8, 16), 8)
    for t in ulysses.transfers(0, "fwd"):
        assert t.inter_bytes == t.nbytes * 4 // 7


def test_zigzag_halves_are_chunk_p_and_chunk_2p_minus_1_minus_p_of_every_document():
    """Documents of 10 and 3 tokens on 2 shards: each padded to a multiple of 4 (12 and 4) and
    cut into 4 chunks (3 and 1 tokens); shard p's halves are chunk p, then chunk 3 - p, of
    both documents, as the published code's ``thd_read_half_tensor`` reads them."""
    docs = np.array([10, 3])
    layouts = place_zigzag(docs, 2).layouts
    pad = -1
    assert [h.tolist() for h in zigzag_halves(layouts[0], docs, 2)] == [
        [0, 1, 2, 10],
        [9, pad, pad, pad],
    ]
    assert [h.tolist() for h in zigzag_halves(layouts[1], docs, 2)] == [
        [3, 4, 5, 11],
        [6, 7, 8, 12],
    ]
