"""Implementation harnesses: the same schedule costed as the published baselines run it.

Expectations are computed by hand from the memory passes and exchange rules that
`lcab.plan.harness` states for each implementation.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lcab.cp import STRATEGIES
from lcab.kernels import Problem
from lcab.masks import make_mask
from lcab.plan.hardware import Hardware, Link
from lcab.plan.harness import LCAB, LONGCA, Elements, Passes
from lcab.plan.model import CostModel, predict_pass
from lcab.plan.replay import replay
from tests.helpers.plan_hardware import hand_hardware

S, HQ, HKV, D = 1024, 8, 2, 64
PROBLEM = Problem(S, S, HQ, HKV, D, torch.bfloat16)  # 2-byte elements, 4-byte accumulators
MEMORY_GBPS = 2.0


def hardware() -> Hardware:
    """Hand-countable costs (`hand_hardware`) with 2 GB/s memory, so copies show."""
    return hand_hardware(memory_gbps=MEMORY_GBPS)


def test_passes_count_element_and_accumulator_bytes_over_whole_and_active_tensors():
    passes = Passes(q=(3, 1), kv=(2, 0.5), active_q=(1, 0), active_kv=(0, 2))
    elements = Elements(q=10, kv=4, active_q=6, active_kv=3)
    whole = 10 * (3 * 2 + 1 * 4) + 4 * (2 * 2 + 0.5 * 4)
    assert passes.bytes(elements, elem=2, acc=4) == whole + 6 * 2 + 3 * 2 * 4


def test_longca_ring_of_two_sends_in_two_phases_and_pays_its_copies():
    mask = make_mask("full", S)
    strategy = STRATEGIES.get("ring")({"balance": "contiguous"}, 2)
    r = replay(strategy, mask, PROBLEM, 2, harness=LONGCA)
    shard = S // 2
    q_elems, kv_elems = shard * HQ * D, shard * HKV * D
    step_flops = 4 * shard * shard * HQ * D
    block = 2 * shard * HKV * D * 2  # K and V of one shard, bf16
    # forward: unpad q 2 + pad out 3 passes per q element, unpad k, v 4 per kv element
    copies = (q_elems * 5 * 2 + kv_elems * 4 * 2) / (MEMORY_GBPS * 1e9)
    step = step_flops / 1e12 + copies
    # after the ring, exposed: correct the result by each step's output (3 passes per q
    # element and step) after zero-filling it once (1)
    merge = q_elems * (3 * 2 + 1) * 2 / (MEMORY_GBPS * 1e9)
    # isend, then irecv: the block crosses the (slow, so exposed) link twice in turn
    slow = dataclasses.replace(hardware(), intra=Link(0.05, 0.0))
    exchange = 2 * block / 0.05e9
    assert exchange > step
    fwd = predict_pass(r, slow, "ranges", "fwd")
    assert fwd.time_ms == pytest.approx(1e3 * (max(step, exchange) + step + merge))
    # backward: 12 passes per q element, 10 per kv; the bf16 dK/dV accumulator of step 0
    # travels during step 1's compute (nothing exposed after a step), but adding a step's
    # dK/dV into the accumulator its transfer brings (cat 4 + add 6 passes per kv element)
    # waits for that transfer
    step_b = 2.5 * step_flops / 0.5e12 + (q_elems * 12 * 2 + kv_elems * 10 * 2) / (
        MEMORY_GBPS * 1e9
    )
    accumulate = kv_elems * 10 * 2 / (MEMORY_GBPS * 1e9)
    # then the projections' weight gradients: x (512 x 1024) by dQ, dK, dV (12 heads of 64),
    # at the profile's forward rate (it names no matrix-product rate); bias sums read the
    # gradients once, the weight gradients are added into the previous ones (3 passes)
    outputs = (HQ + 2 * HKV) * D
    projections = 2 * shard * 1024 * outputs / 1e12 + (shard + 3 * 1024) * outputs * 2 / (
        MEMORY_GBPS * 1e9
    )
    bwd = predict_pass(r, slow, "ranges", "bwd")
    assert bwd.time_ms == pytest.approx(
        1e3 * (2 * (max(step_b, exchange) + accumulate) + projections)
    )
    assert bwd.comm_ms == pytest.approx(2e3 * max(0.0, exchange - step_b))
    faster = dataclasses.replace(slow, matmul_tflops=4.0)
    saved = 2 * shard * 1024 * outputs * (1 / 1e12 - 1 / 4e12)
    assert predict_pass(r, faster, "ranges", "bwd").time_ms == pytest.approx(
        bwd.time_ms - 1e3 * saved
    )


def test_lcab_ring_of_two_batches_its_exchange_and_overlaps_the_float32_accumulator():
    mask = make_mask("full", S)
    strategy = STRATEGIES.get("ring")({"balance": "contiguous"}, 2)
    r = replay(strategy, mask, PROBLEM, 2, harness=LCAB)
    shard = S // 2
    q_elems, kv_elems = shard * HQ * D, shard * HKV * D
    step_flops = 4 * shard * shard * HQ * D
    block = 2 * shard * HKV * D * 2
    merge = q_elems * (2 + 2 * 4) / (MEMORY_GBPS * 1e9)  # read step out, read + write fp32
    step = step_flops / 1e12 + merge
    fwd = predict_pass(r, hardware(), "ranges", "fwd")
    assert fwd.time_ms == pytest.approx(1e3 * (max(step, block / 1e9) + step))
    merge_b = q_elems * (2 + 8) / (MEMORY_GBPS * 1e9)  # dq: during the step
    step_b = 2.5 * step_flops / 0.5e12 + merge_b
    # dK/dV into the accumulator the transfer brought: after the wait
    accumulate = kv_elems * 2 * (2 + 8) / (MEMORY_GBPS * 1e9)
    dkv = 2 * block / 1e9  # float32: twice the bf16 block
    bwd = predict_pass(r, hardware(), "ranges", "bwd")
    # step 0 under the K/V transfer; step 1 under step 0's accumulator; the hop home exposed
    expected = (max(step_b, block / 1e9) + accumulate) + (max(step_b, dkv) + accumulate) + dkv
    assert bwd.time_ms == pytest.approx(1e3 * expected)


def test_longca_all_gather_gathers_again_in_the_backward():
    mask = make_mask("causal", S)
    strategy = STRATEGIES.get("ring_allgather")({"balance": "zigzag"}, 4)
    ours = replay(strategy, mask, PROBLEM, 4, harness=LCAB)
    theirs = replay(strategy, mask, PROBLEM, 4, harness=LONGCA)
    for rank in range(4):
        assert [t.op for t in ours.transfers(rank, "bwd")] == ["allgather_kv_grad"]
        assert [t.op for t in theirs.transfers(rank, "bwd")] == [
            "allgather_kv",
            "allgather_kv_grad",
        ]
        # the forward gathers the same bytes in both
        assert (
            ours.bytes_by_op(rank)["allgather_kv"] * 2 == theirs.bytes_by_op(rank)["allgather_kv"]
        )
        # one call per zigzag half, chunks r and 7 - r of 8 (128 tokens each), each against
        # the keys it attends: up to the end of its chunk; together the work of lcab's one call
        halves = theirs.work(rank, "fwd")
        assert len(halves) == 2
        assert sum(w.flops for w in halves) == pytest.approx(ours.work(rank, "fwd")[0].flops)
        q_half = (S // 8) * HQ * D
        for chunk, work in zip((rank, 7 - rank), halves, strict=True):
            attended = (chunk + 1) * (S // 8) * HKV * D
            # plain: extract the half 2, zero-fill out 1, collect 2; gathers: q 2, k, v 4 per
            # attended key; scatters: out 2 (every causal row is active)
            assert work.memory_bytes == pytest.approx(2 * (9 * q_half + 4 * attended))
            assert work.gather_bytes == pytest.approx(2 * (2 * q_half + 4 * attended))
            assert work.scatter_bytes == pytest.approx(2 * 2 * q_half)
        # once per forward, before the calls and in their stage: the reorder of the gathered
        # k, v (a gather: read and write of each of S keys)
        (stage,) = [st for st in theirs.passes["fwd"][rank][0].stages if st.calls]
        once = stage.calls[0]
        assert once.flops == 0 and stage.calls[1:] == tuple(halves)
        assert once.memory_bytes == once.gather_bytes == pytest.approx(2 * 4 * S * HKV * D)
        assert ours.work(rank, "fwd")[0].memory_bytes == 0


def test_a_stage_s_calls_add_up_before_it_waits_for_the_slowest_rank():
    """Ring All-Gather's two calls per rank run back to back: on a causal mask rank 0's first
    half (chunk 0) is the cheapest call and its second (chunk 7) the dearest, rank 3's nearly
    even; waiting for the slowest rank after each call would charge the dearest call twice, the
    stage charges the slowest rank's sum."""
    mask = make_mask("causal", S)
    strategy = STRATEGIES.get("ring_allgather")({"balance": "zigzag"}, 4)
    r = replay(strategy, mask, PROBLEM, 4, harness=LONGCA)
    model = CostModel(hardware(), "ranges", 4)
    calls = [[model.compute_s(w, False) for w in r.work(rank, "fwd")] for rank in range(4)]
    once = model.compute_s(r.passes["fwd"][0][0].stages[-1].calls[0], False)
    per_rank = [once + sum(c) for c in calls]
    mean = sum(per_rank) / 4
    pred = predict_pass(r, hardware(), "ranges", "fwd")
    assert pred.compute_ms == pytest.approx(1e3 * mean)
    assert pred.imbalance_ms == pytest.approx(1e3 * (max(per_rank) - mean))
    per_call_lockstep = once + sum(max(c[i] for c in calls) for i in range(2))
    assert max(per_rank) < 0.9 * per_call_lockstep


def test_harnesses_change_costs_not_work():
    mask = make_mask("causal_document", S, seed=3)
    for name in ("ring", "usp", "loongtrain", "ulysses"):
        strategy = STRATEGIES.get(name)({}, 2)
        ours, theirs = (replay(strategy, mask, PROBLEM, 8, harness=h) for h in (LCAB, LONGCA))
        for rank in range(8):
            for pass_ in ("fwd", "bwd"):
                flops = [w.flops for w in ours.work(rank, pass_)]
                assert flops == [w.flops for w in theirs.work(rank, pass_)]
                assert {t.phases for t in ours.transfers(rank, pass_)} <= {1}
                # unbatched exchanges run in two phases only in rings of two: LoongTrain's
                # ring of 4 (Ulysses 2 x ring 4) is 2 windows of 2; Ring's 8 and USP's 4 are not
                phases = {t.phases for t in theirs.transfers(rank, pass_) if t.kind == "p2p"}
                expected = {"ring": {1}, "usp": {1}, "loongtrain": {2}, "ulysses": set()}
                assert phases == expected[name]


def test_longca_loongtrain_backward_waits_for_the_hop_after_each_window():
    mask = make_mask("causal", S)
    options = {"ulysses_degree": 1, "window_count": 2, "balance": "zigzag"}
    strategy = STRATEGIES.get("loongtrain")(options, 4)  # a ring of 4: 2 windows of 2
    theirs = replay(strategy, mask, PROBLEM, 4, harness=LONGCA)

    def shape(window):
        stages = [
            ([t.op for t in s.during], [t.op for t in s.after], s.work is not None)
            for s in window.stages
        ]
        return stages, [t.op for t in window.background]

    first, second, projections = (shape(w) for w in theirs.passes["bwd"][0])
    assert projections == ([([], [], True)], [])  # the projections' gradients, last
    kv, dkv = "loong_inner_kv_bwd", "loong_inner_dkv"
    # inside a window: the next K/V during step 0, step 0's accumulator during step 1, then
    # the hop after the last step, waited at once; the next window's K/V in the background
    assert first == (
        [([kv], [], True), ([dkv], [], True), ([], [dkv], False)],
        ["loong_outer_kv_bwd"],
    )
    # the first window's accumulator reaches the next window during its first step; the last
    # window's is waited for at the end
    assert second == (
        [
            ([kv, "loong_outer_dkv"], [], True),
            ([dkv], [], True),
            ([], [dkv], False),
            ([], ["loong_outer_dkv"], False),
        ],
        [],
    )
    # lcab's runner now overlaps its accumulators the same way (in float32, no projections)
    ours = replay(strategy, mask, PROBLEM, 4, harness=LCAB)
    assert [shape(w) for w in ours.passes["bwd"][0]] == [first, second]


def test_longca_calls_list_every_document_and_lcab_calls_only_those_with_work():
    """The baselines keep every document in each call's ``cu_seqlens`` (empty ones zeroed by
    ``generate_valid_cu_seqlens``); lcab's lowering gives a call the documents it has work in.
    Both see the same longest key sequence and the same attended columns."""
    mask = make_mask(
        "causal_document", S, seed=3, doc_source="uniform", min_doc_len=40, max_doc_len=300
    )
    documents = len(mask.doc_lengths)
    strategy = STRATEGIES.get("ring")({"balance": "zigzag"}, 4)
    ours = replay(strategy, mask, PROBLEM, 4, harness=LCAB)
    theirs = replay(strategy, mask, PROBLEM, 4, harness=LONGCA)
    for rank in range(4):
        for mine, published in zip(ours.work(rank, "bwd"), theirs.work(rank, "bwd"), strict=True):
            assert published.sequences == documents
            assert mine.sequences == mine.key_documents <= documents
            assert 0 < mine.longest_keys == published.longest_keys <= mine.key_columns
            assert mine.q_heads == published.q_heads == HQ
            # the baselines hand FA3 the unpadded tokens with work, lcab its whole shards
            assert published.q_elements == published.rows * HQ * D
            assert published.kv_elements == published.key_columns * HKV * D
            assert mine.q_elements == ours.plan.shard_len * HQ * D  # padded shard
    assert any(w.rows < S // 4 for w in theirs.work(0, "bwd"))  # some calls have fewer rows


@pytest.mark.parametrize("name", ["ulysses", "usp", "loongtrain"])
def test_longca_ulysses_groups_pay_their_layout_copies_once_per_pass(name):
    # Ulysses, and USP / LoongTrain around their rings, copy to head-major and back around the
    # all-to-alls: forward 6 passes per q element (q in 4, out 2) and 8 per kv element (k, v
    # in); backward 8 and 8 (dout, dq; dk, dv) — over the tensors a member holds between the
    # all-to-alls: all tokens of its group's shards, HQ / U query heads and HKV / U key heads
    # (one when U exceeds HKV: the key heads are repeated to U)
    mask = make_mask("full", S)
    options = {} if name == "ulysses" else {"ulysses_degree": 2, "balance": "zigzag"}
    strategy = STRATEGIES.get(name)(options, 4)
    theirs = replay(strategy, mask, PROBLEM, 4, harness=LONGCA)
    ours = replay(strategy, mask, PROBLEM, 4, harness=LCAB)
    u = 4 if name == "ulysses" else 2
    tokens = S if name == "ulysses" else S // 2  # a group holds the shards of its u members
    q_elems, kv_elems = tokens * (HQ // u) * D, tokens * max(HKV // u, 1) * D
    for pass_, (q_passes, kv_passes) in {"fwd": (6, 8), "bwd": (8, 8)}.items():
        for rank in range(4):
            first = theirs.passes[pass_][rank][0].stages[0]  # before the first all-to-all
            assert first.after and {t.kind for t in first.after} == {"a2a"}
            assert first.work is not None and first.work.flops == 0
            assert first.work.memory_bytes == pytest.approx(
                2 * (q_passes * q_elems + kv_passes * kv_elems)
            )
            assert ours.passes[pass_][rank][0].stages[0].work is None  # lcab: none


def test_longca_causal_ring_steps_call_with_the_half_they_need():
    """On a causal mask the published ring extracts half of q (K/V from a later position) or
    of K/V (from an earlier one) and calls, pads and merges over it (``thd_read_half_tensor``);
    its kernels get only the tokens with work. lcab's runner calls with whole shards."""
    world, chunk = 4, S // 8
    mask = make_mask("causal", S)
    strategy = STRATEGIES.get("ring")({"balance": "zigzag"}, world)
    theirs = replay(strategy, mask, PROBLEM, world, harness=LONGCA)
    ours = replay(strategy, mask, PROBLEM, world, harness=LCAB)
    attends = torch.ones(S, S).tril().bool()
    q_size, kv_size, tokens = HQ * D, HKV * D, S // world

    def positions(p: int) -> torch.Tensor:  # zigzag: chunks p and 2R - 1 - p
        pieces = (p * chunk, (2 * world - 1 - p) * chunk)
        return torch.cat([torch.arange(a, a + chunk) for a in pieces])

    for p in range(world):
        for t, (mine, published) in enumerate(
            zip(ours.work(p, "fwd"), theirs.work(p, "fwd"), strict=True)
        ):
            source = (p - t) % world
            block = attends[positions(p)][:, positions(source)]
            rows, cols = int(block.any(1).sum()), int(block.any(0).sum())
            half_q, half_kv = source > p, source < p
            q_tokens = tokens // 2 if half_q else tokens
            kv_tokens = tokens // 2 if half_kv else tokens
            assert rows == (tokens // 2 if half_q else tokens)  # the half the code keeps
            assert cols == (tokens // 2 if half_kv else tokens)
            # zero-fill 1 over the call's q, unpad q 2 + pad 2 over its rows, unpad k, v 4
            # over its columns; extracting a half reads and writes it (q: 2, k and v: 4)
            passes = q_tokens * q_size + 4 * rows * q_size + 4 * cols * kv_size
            passes += 2 * q_tokens * q_size * half_q + 4 * kv_tokens * kv_size * half_kv
            assert published.memory_bytes == pytest.approx(2 * passes)
            assert published.q_elements == rows * q_size  # the kernel gets the unpadded rows
            assert mine.q_elements == tokens * q_size
            assert mine.memory_bytes == pytest.approx(tokens * q_size * (2 + 2 * 4))
        # after the ring: the result zero-filled once, then corrected by each step's output
        # over the queries the step called with (3 passes)
        merged = sum(tokens // 2 if (p - t) % world > p else tokens for t in range(world))
        last = theirs.passes["fwd"][p][-1].stages
        assert len(last) == 1 and last[0].work is not None and not last[0].during
        assert last[0].work.flops == 0
        assert last[0].work.memory_bytes == pytest.approx(2 * (tokens + 3 * merged) * q_size)
        assert len(ours.passes["fwd"][p]) == 1  # lcab merges within each step
        # backward: adding the step's dK/dV into the arriving accumulator (cat 4 + add 6) runs
        # over the K/V the step called with, after the step's transfer; lcab adds dK and dV
        # (bf16) into its float32 accumulator after the wait too (2 x 2 + 4 x 4 bytes), over
        # its whole K/V, and then waits for the last hop home (a stage with no work)
        for t, stage in enumerate(theirs.passes["bwd"][p][0].stages):
            source = (p - t) % world
            kv_tokens = tokens // 2 if source < p else tokens
            (accumulate,) = stage.finish
            assert accumulate.flops == 0
            assert accumulate.memory_bytes == pytest.approx(2 * 10 * kv_tokens * kv_size)
        *steps, home = ours.passes["bwd"][p][0].stages
        assert home.work is None and not home.finish and [t.op for t in home.after]
        for stage in steps:
            (accumulate,) = stage.finish
            assert accumulate.memory_bytes == pytest.approx((2 * 2 + 4 * 4) * tokens * kv_size)
    full = replay(strategy, make_mask("full", S), PROBLEM, world, harness=LONGCA)
    whole = 5 * tokens * q_size + 4 * tokens * kv_size
    assert [w.memory_bytes for w in full.work(0, "fwd")] == [pytest.approx(2 * whole)] * world


def test_packed_varlen_calls_tile_each_document_once_however_many_chunks_it_came_from():
    """Zigzag on 2 ranks holds chunks 0 and 3 of each of 3 documents on rank 0: six runs of
    rows in the padded layout, which a kernel reading the layout tiles one by one (lcab's),
    but three sequences once the published code packs each document's valid tokens together."""
    mask = make_mask("full_document", S, doc_lengths=[512, 256, 256])
    strategy = STRATEGIES.get("ring")({"balance": "zigzag"}, 2)
    ours, theirs = (replay(strategy, mask, PROBLEM, 2, harness=h) for h in (LCAB, LONGCA))
    for pass_ in ("fwd", "bwd"):
        assert [w.runs for w in ours.work(0, pass_)] == [6, 6]
        assert [w.runs for w in theirs.work(0, pass_)] == [3, 3]
