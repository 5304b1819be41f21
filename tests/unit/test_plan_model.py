"""The planner's cost model against hand-computed times."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lcab.cp import STRATEGIES
from lcab.cp.stages import Stage, Transfer
from lcab.kernels import Problem
from lcab.masks import make_mask
from lcab.plan.calibrate import whole_mask_call
from lcab.plan.hardware import KernelRate, load_profile
from lcab.plan.model import CostModel, predict_pass
from lcab.plan.predict import PlanCell
from lcab.plan.replay import replay
from lcab.plan.steps import Work
from tests.helpers.plan_hardware import hand_hardware

S, HQ, HKV, D = 1024, 8, 8, 64
PROBLEM = Problem(S, S, HQ, HKV, D, torch.float32)


def test_ring_of_two_overlaps_the_transfer_with_the_first_step():
    mask = make_mask("full", S)
    strategy = STRATEGIES.get("ring")({"balance": "contiguous"}, 2)
    r = replay(strategy, mask, PROBLEM, 2)
    step_flops = 4 * (S // 2) * (S // 2) * HQ * D  # every pair is a full S/2 x S/2 block
    compute = step_flops / 1e12
    kv_block = 2 * (S // 2) * HKV * D * 4  # k and v of one shard, float32
    transfer = kv_block / 1e9
    fwd = predict_pass(r, hand_hardware(), "ranges", "fwd")
    assert fwd.time_ms == pytest.approx(1e3 * (max(compute, transfer) + compute))
    assert fwd.compute_ms == pytest.approx(2e3 * compute)
    assert fwd.imbalance_ms == pytest.approx(0.0, abs=1e-12)
    # backward: 2.5x the work at half the rate; K/V overlapped with step 0, step 0's dK/dV
    # accumulator with step 1, and the last hop (home) exposed
    bwd = predict_pass(r, hand_hardware(), "ranges", "bwd")
    c_b = 2.5 * step_flops / 0.5e12
    dkv = kv_block / 1e9  # float32 accumulators: same bytes as the float32 block
    assert bwd.time_ms == pytest.approx(1e3 * (max(c_b, transfer) + max(c_b, dkv) + dkv))


def test_ulysses_pays_its_all_to_alls_in_full_and_inter_node_bytes_at_the_inter_rate():
    mask = make_mask("full", S)
    strategy = STRATEGIES.get("ulysses")({}, 2)  # world 4 on two nodes of 2
    r = replay(strategy, mask, PROBLEM, 4)
    compute = 4 * S * S * (HQ // 4) * D / 1e12
    shard = S // 4
    q = shard * HQ * D * 4 * 3 // 4  # bytes for the 3 peers
    kv = shard * HKV * D * 4 * 3 // 4
    sent_in, sent_out = q + 2 * kv, q  # q, k, v in; out back
    # 2 of 3 peers are on the other node: max(intra 1/3 at 1 GB/s, inter 2/3 at 0.25 GB/s)
    cost = lambda b: max(b / 3 / 1e9, 2 * b / 3 / 0.25e9)  # noqa: E731
    fwd = predict_pass(r, hand_hardware(), "ranges", "fwd")
    assert fwd.time_ms == pytest.approx(1e3 * (cost(sent_in) + compute + cost(sent_out)), rel=1e-6)
    assert fwd.inter_bytes == pytest.approx((sent_in + sent_out) * 2 / 3, rel=1e-6)


def test_ranks_beyond_the_compute_slots_of_a_node_share_them():
    mask = make_mask("full", S)
    strategy = STRATEGIES.get("ulysses")({}, 4)
    r = replay(strategy, mask, PROBLEM, 4)
    alone = predict_pass(r, hand_hardware(), "ranges", "fwd").compute_ms
    shared = predict_pass(r, hand_hardware(compute_slots_per_node=2), "ranges", "fwd").compute_ms
    assert shared == pytest.approx(2 * alone)


def test_the_median_of_mask_samples_is_one_real_sample_of_median_throughput():
    from lcab.plan.predict import mask_for, predict, predict_median

    cell = PlanCell(
        "usp",
        "fa3",
        "causal_document",
        8192 * 16,
        2,
        8,
        64,
        8,
        128,
        "bfloat16",
        mask_params={"doc_source": "long"},
        mask_seed=3,
    )
    hw = load_profile("h100_nvlink_ib")
    each = [predict(cell, hw, mask_for(cell, s)) for s in range(3)]

    def step(p):
        flops = p.fwd.tflops * p.fwd.time_ms + p.bwd.tflops * p.bwd.time_ms
        return flops / (p.fwd.time_ms + p.bwd.time_ms)

    chosen = predict_median(cell, hw, samples=3)
    assert step(chosen) == sorted(step(p) for p in each)[1]
    assert chosen.fwd in [p.fwd for p in each]


def test_forward_tiles_pack_query_heads_and_the_backward_saturates_on_queries_per_key():
    """Hand-computed call times for a FlashAttention-3-like rate.

    Forward: 8 query heads per KV head pack 128-row tiles into 16 tokens, so each of the 10 runs
    wastes 7.5 rows on average, and rows of 900 keys reach 900 / (900 + 100) of the plateau.
    Backward: a 128-column key tile sweeps the 50 queries that attend each key in 64-row tiles,
    not packed; 10 documents, each one run of rows and one run of 2000 / 10 key columns, so a
    key column sweeps one run, whose last tile adds 31.5 padded rows on average to the sweep
    (50 + 31.5 against the half point of 200, which the padding does not scale), and each
    document's keys end in a partly filled key tile (63.5 padded columns on average).
    """
    rate = KernelRate(
        1.0,
        0.5,
        100.0,
        0.0,
        tile_rows=128,
        bwd_tile_rows=64,
        pack_gqa=True,
        bwd_half_keys=200.0,
        bwd_block_cols=128.0,
    )
    model = CostModel(hand_hardware(kernels={"default": rate}), "any", 1)
    work = Work(
        1e12,
        900.0,
        rows=1000.0,
        runs=10.0,
        q_per_kv=8.0,
        mean_queries=50.0,
        key_columns=2000.0,
        key_runs=10.0,
    )
    fwd_efficiency = 900 / 1000 * 1000 / (1000 + 10 * 15 / 2)
    assert model.compute_s(work, bwd=False) == pytest.approx(1.0 / fwd_efficiency)
    bwd_efficiency = 50 / (50 + 31.5 + 200) * 2000 / (2000 + 10 * 127 / 2)
    assert model.compute_s(work, bwd=True) == pytest.approx(2.0 / bwd_efficiency)
    # one run of keys shared by the ten runs of rows: each column sweeps all ten
    shared = dataclasses.replace(work, key_runs=1.0)
    assert model.compute_s(shared, bwd=True) == pytest.approx(
        2.0 / (50 / (50 + 10 * 31.5 + 200) * 2000 / (2000 + 127 / 2))
    )
    # without packing the forward pads whole 128-row tiles
    plain = CostModel(
        hand_hardware(kernels={"default": dataclasses.replace(rate, pack_gqa=False)}), "any", 1
    )
    assert plain.compute_s(work, bwd=False) == pytest.approx(
        1.0 / (900 / 1000 * 1000 / (1000 + 10 * 127 / 2))
    )


def test_recommendation_ranks_every_candidate_by_its_median_step_over_the_same_masks():
    from lcab.plan.predict import mask_for, predict
    from lcab.plan.recommend import candidates, recommend, step_ms

    docs = {"doc_source": "uniform", "min_doc_len": 30, "max_doc_len": 900}
    cell = PlanCell("usp", "ranges", "causal_document", 2048, 2, 2, 8, 8, 16, "float32")
    cell = cell.with_(mask_params=docs)
    hardware = load_profile("cpu_gloo_local")
    answer = recommend(cell, hardware, samples=3)
    masks = [mask_for(cell, s) for s in range(3)]
    expected = {}
    for c in candidates(cell):
        times = sorted(step_ms(predict(c, hardware, m)) for m in masks)
        expected[(c.cp, tuple(sorted(c.cp_options.items())))] = times[1]  # median of three
    got = [(p.cell.cp, tuple(sorted(p.cell.cp_options.items()))) for p in answer.ranked]
    assert sorted(got) == sorted(expected)
    assert [step_ms(p) for p in answer.ranked] == pytest.approx([expected[k] for k in got])
    assert [expected[k] for k in got] == sorted(expected.values())
    assert answer.margin == pytest.approx(expected[got[1]] / expected[got[0]] - 1.0)


def test_a_what_if_setting_changes_that_parameter_and_says_so():
    from lcab.plan.cli import with_settings

    base = load_profile("h100_nvlink_ib")
    changed = with_settings(base, ["kernels.fa3.call_us=500", "inter.gbps=25"])
    assert changed.kernels["fa3"].call_us == 500 and changed.inter.gbps == 25
    assert changed.kernels["fa2"] == base.kernels["fa2"] and changed.intra == base.intra
    assert changed.name == "h100_nvlink_ib with kernels.fa3.call_us=500 inter.gbps=25"
    assert with_settings(base, []) is base
    assert "matmul_tflops" in base.parameter_names()
    assert "sources" not in " ".join(base.parameter_names())
    assert "kernels.fa3.pack_gqa" not in base.parameter_names()  # a switch, not a number
    # a link can be given its own efficiency for any kind the profile knows, new or not
    linked = with_settings(base, ["intra.efficiency.p2p=0.9", "inter.efficiency.allgather=0.5"])
    assert "p2p" not in base.intra.efficiency
    assert linked.intra.efficiency == {**base.intra.efficiency, "p2p": 0.9}
    assert linked.inter.efficiency == {**base.inter.efficiency, "allgather": 0.5}
    with pytest.raises(KeyError, match=r"intra\.efficiency\.p2p"):  # names the valid ones
        base.with_values({"intra.efficiency.bogus": 0.5})


def test_a_backward_call_pays_its_kernels_passes_over_every_token_it_is_given():
    """FlashAttention-3's backward reads O and dO, zero-fills and reads a float32 dQ
    accumulator and writes dQ over every query token it is given (2 + 2 + 4 + 4 + 2 bytes per
    element), and with grouped heads zero-fills and reads float32 dK and dV accumulators
    (2 x (4 + 4)) — memory time whatever the work, none of it in the forward."""
    model = CostModel(load_profile("h100_nvlink_ib"), "fa3", 1)
    q, kv = 8192 * 64 * 128, 8192 * 8 * 128
    bare = Work(1e9, 1000.0, 100.0, 1.0, 0.0, 8.0, 1000.0)
    given = dataclasses.replace(bare, q_elements=q, kv_elements=kv)
    extra = model.compute_s(given, True) - model.compute_s(bare, True)
    assert extra == pytest.approx((14 * q + 16 * kv) / 3350e9)
    assert model.compute_s(given, False) == pytest.approx(model.compute_s(bare, False))
    mha, mha_bare = (dataclasses.replace(w, q_per_kv=1.0) for w in (given, bare))
    assert model.compute_s(mha, True) - model.compute_s(mha_bare, True) == pytest.approx(
        14 * q / 3350e9
    )


def test_each_ring_step_gives_its_kernel_the_whole_local_shard():
    problem = Problem(960, 960, 24, 4, 16, torch.float32)
    strategy = STRATEGIES.get("ring")({"balance": "zigzag"}, 4)
    mask = make_mask("causal_document", 960, seed=3)
    replayed = replay(strategy, mask, problem, 4)
    shard = replayed.plan.shard_len  # zigzag pads each document to whole chunks
    assert shard >= 960 // 4
    for rank in range(4):
        works = replayed.work(rank, "bwd")
        assert works and all(w.q_elements == shard * 24 * 16 for w in works)
        assert all(w.kv_elements == shard * 4 * 16 for w in works)


def test_a_varlen_backward_pays_accumulator_rows_per_sequence():
    """FA3's varlen backward sizes its float32 accumulators ``total + batch x block`` rows: 64
    more dQ rows (zero-filled and read, 8 bytes an element) and 128 more dK/dV rows (16 bytes an
    element with grouped heads) for each sequence of the call."""
    model = CostModel(load_profile("h100_nvlink_ib"), "fa3", 1)
    q_row, kv_row = 64 * 128, 8 * 128
    rowless = Work(1e9, 1000.0, 100.0, 4.0, 0.0, 8.0, 1000.0)
    four = dataclasses.replace(rowless, q_row_elements=q_row, kv_row_elements=kv_row)
    extra = model.compute_s(four, True) - model.compute_s(rowless, True)
    assert extra == pytest.approx(4 * (64 * q_row * 8 + 128 * kv_row * 16) / 3350e9)
    assert model.compute_s(four, False) == model.compute_s(rowless, False)
    mha, mha_rowless = (dataclasses.replace(w, q_per_kv=1.0) for w in (four, rowless))
    assert model.compute_s(mha, True) - model.compute_s(mha_rowless, True) == pytest.approx(
        4 * 64 * q_row * 8 / 3350e9
    )
    # a call that lists 10 sequences (4 runs of rows: a run per sequence is only the fallback)
    listed, listed_rowless = (dataclasses.replace(w, sequences=10.0) for w in (four, rowless))
    assert model.compute_s(listed, True) - model.compute_s(listed_rowless, True) == pytest.approx(
        10 * (64 * q_row * 8 + 128 * kv_row * 16) / 3350e9
    )


def test_gathers_and_scatters_run_at_their_own_fraction_of_the_memory_rate():
    """Of 1 GB moved outside a call, 0.4 GB are gathers at half the rate and 0.2 GB scatters at
    a quarter: by hand 0.4 GB / 3350 GB/s + 0.4 GB / 1675 GB/s + 0.2 GB / 837.5 GB/s; the
    other bytes keep the full rate."""
    hardware = dataclasses.replace(
        load_profile("h100_nvlink_ib"), gather_efficiency=0.5, scatter_efficiency=0.25
    )
    model = CostModel(hardware, "fa3", 1)
    plain = Work(0.0, 0.0, memory_bytes=1e9)
    gathered = dataclasses.replace(plain, gather_bytes=4e8)
    both = dataclasses.replace(gathered, scatter_bytes=2e8)
    assert model.compute_s(plain, False) == pytest.approx(1e9 / 3350e9)
    assert model.compute_s(gathered, False) == pytest.approx(6e8 / 3350e9 + 4e8 / 1675e9)
    assert model.compute_s(both, False) == pytest.approx(
        4e8 / 3350e9 + 4e8 / 1675e9 + 2e8 / 837.5e9
    )


def test_a_varlen_backward_pays_the_blocks_its_grid_launches_without_work():
    """FA3's varlen backward launches ceil(max_seqlen_k / 128) blocks per query head for every
    sequence of the call; blocks past a sequence's end only exit, each holding one of the H100's
    132 multiprocessors for the profile's ``bwd_empty_block_us``. By hand: 10 sequences, the longest
    300 attended keys -> 3 blocks each = 30 per head; busy: 1000 columns / 128 + 5 sequences
    with keys x half a tile padded = 10.3125; 4 query heads -> 78.75 empty blocks."""
    hardware = load_profile("h100_nvlink_ib")
    model = CostModel(hardware, "fa3", 1)
    bare = Work(1e9, 1000.0, 100.0, 4.0, 0.0, 8.0, 1000.0)
    call = dataclasses.replace(
        bare, q_heads=4, sequences=10, key_columns=1000, key_documents=5, longest_keys=300
    )
    extra = model.compute_s(call, True) - model.compute_s(bare, True)
    assert extra == pytest.approx(78.75 * hardware.rate("fa3").bwd_empty_block_us * 1e-6 / 132)
    assert model.compute_s(call, False) == model.compute_s(bare, False)  # forward: persistent
    # one sequence that fills its grid: nothing launched idle
    full = dataclasses.replace(
        call, sequences=1, key_documents=1, key_columns=384, longest_keys=384
    )
    assert model.empty_blocks_s(full) == 0.0
    # a profile without multiprocessors (a CPU) costs no grid
    cpu = CostModel(dataclasses.replace(hardware, multiprocessors=None), "fa3", 1)
    assert cpu.empty_blocks_s(call) == 0.0


def test_work_that_waits_for_the_stage_s_transfers_is_not_hidden_behind_them():
    # hand hardware: 1 TFLOP/s forward, 1 GB/s inside a node, memory at 2 GB/s here
    hw = hand_hardware(memory_gbps=2.0)
    model = CostModel(hw, "ranges", 2)
    call = Work(flops=3e9, mean_keys=1e9)  # 3 ms at 1 TFLOP/s
    accumulate = Work(0.0, 0.0, memory_bytes=2e6)  # 1 ms at 2 GB/s
    for transfer_ms in (1.0, 5.0):  # shorter, then longer than the call
        moved = Transfer("ring_kv", "p2p", int(transfer_ms * 1e6), 0)
        hidden = Stage(call, during=(moved,), then=(accumulate,))
        waiting = Stage(call, during=(moved,), finish=(accumulate,))
        assert model.stage_s(hidden, False)[0] == pytest.approx(1e-3 * max(3 + 1, transfer_ms))
        assert model.stage_s(waiting, False) == pytest.approx(
            (1e-3 * (max(3, transfer_ms) + 1), 4e-3)
        )


def test_a_link_s_own_efficiency_for_a_kind_overrides_the_profile_s_on_that_link_only():
    # hand hardware: 1 GB/s inside a node, 0.25 GB/s across; profile efficiency 1 for all kinds
    hw = hand_hardware(efficiency={"allgather": 1.0, "p2p": 1.0})
    slow = dataclasses.replace(
        hw, inter=dataclasses.replace(hw.inter, efficiency={"allgather": 0.5})
    )
    # 3 MB inside the node and 1 MB across: 3 ms vs 4 ms (8 ms at half the rate)
    gather = Transfer("allgather_kv", "allgather", 4_000_000, 1_000_000)
    p2p = Transfer("ring_kv", "p2p", 4_000_000, 1_000_000)
    assert CostModel(hw, "ranges", 8).transfer_s(gather) == pytest.approx(4e-3)
    assert CostModel(slow, "ranges", 8).transfer_s(gather) == pytest.approx(8e-3)
    assert CostModel(slow, "ranges", 8).transfer_s(p2p) == pytest.approx(4e-3)
    only_inside = Transfer("allgather_kv", "allgather", 4_000_000, 0)
    assert CostModel(slow, "ranges", 8).transfer_s(only_inside) == pytest.approx(4e-3)


def test_a_single_device_cpu_cell_runs_on_every_core_and_a_rank_on_one():
    """`lcab.bench.worker` leaves a single-device cell torch's threads (the node's cores) and
    gives each rank of a context-parallel cell one; the ranks beyond the cores share them."""
    profile = load_profile("cpu_gloo_local")
    assert profile.compute_slots_per_node == 2
    assert CostModel(profile, "ranges", 1, alone=True).compute_share == 2.0
    assert CostModel(profile, "ranges", 2).compute_share == 1.0
    assert CostModel(profile, "ranges", 1).compute_share == 1.0  # a rank alone on its node
    assert CostModel(profile, "ranges", 4).compute_share == 0.5
    gpu = load_profile("h100_nvlink_ib")
    assert CostModel(gpu, "fa3", 1, alone=True).compute_share == 1.0


def test_a_cpu_kernel_runs_faster_per_flop_at_a_larger_head_dim():
    """Per attended position: 4·d products plus ``position_flops`` (175 on the CPU profile's
    `ranges`, measured 2026-11-27: 50.6 / 69.4 / 89.2 GFLOP/s forward at d 32 / 64 / 128 on
    one thread), so d 64 costs (256 + 175) / (128 + 175) of d 32's time per position."""
    model = CostModel(load_profile("cpu_gloo_local"), "ranges", 2)
    mask = make_mask("full", 2048)
    d32 = model.compute_s(whole_mask_call(mask, 8, 2, 32), False)
    d64 = model.compute_s(whole_mask_call(mask, 8, 2, 64), False)
    assert d64 / d32 == pytest.approx((256 + 175) / (128 + 175), rel=1e-3)
    bwd32, bwd64 = (
        model.compute_s(dataclasses.replace(w, flops=w.flops * 2.5), True)
        for w in (whole_mask_call(mask, 8, 2, 32), whole_mask_call(mask, 8, 2, 64))
    )
    assert bwd64 / bwd32 == pytest.approx((640 + 300) / (320 + 300), rel=1e-3)
    fa3 = CostModel(load_profile("h100_nvlink_ib"), "fa3", 8)
    assert fa3.position_factor(whole_mask_call(mask, 8, 2, 64), False) == 1.0
