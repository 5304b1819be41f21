"""CP plans from the mask alone: balancers, head splits, analytic communication."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.cp import STRATEGIES
from lcab.cp.balance import BALANCERS, place
from lcab.cp.base import head_split
from lcab.kernels import Problem
from lcab.masks import make_mask

DOCS = {"doc_source": "uniform", "min_doc_len": 1, "max_doc_len": 300}


@settings(max_examples=60, deadline=None)
@given(
    seqlen=st.integers(1, 700),
    shards=st.integers(1, 9),
    multiple=st.sampled_from([1, 2, 3]),
    balancer=st.sampled_from(BALANCERS),
    seed=st.integers(0, 50),
)
def test_placements_are_bijections_over_real_tokens(seqlen, shards, multiple, balancer, seed):
    mask = make_mask("causal_document", seqlen, seed=seed, **DOCS)
    placement = place(mask, shards, balancer, multiple)
    lengths = {len(layout) for layout in placement.layouts}
    assert len(lengths) == 1 and lengths.pop() % multiple == 0  # equal, splittable shards
    tokens = np.concatenate(placement.layouts)
    real = tokens[tokens >= 0]
    assert np.array_equal(np.sort(real), np.arange(seqlen))  # every token exactly once
    assert placement.padding_tokens == len(tokens) - seqlen
    areas = placement.areas(mask)
    assert np.isclose(areas.sum(), mask.area())


def row_counts(mask):
    dense = mask.to_dense().numpy()
    return dense.sum(1)


@pytest.mark.parametrize("shards", [2, 3, 4, 8])
def test_zigzag_balances_causal_exactly_and_pads_per_document(shards):
    mask = make_mask("causal", 4096)
    placement = place(mask, shards, "zigzag")
    # independent check: shard p holds chunks p and 2P-1-p of 2P equal chunks
    if 4096 % (2 * shards) == 0:
        chunk = 4096 // (2 * shards)
        expected0 = np.concatenate([np.arange(0, chunk), np.arange(4096 - chunk, 4096)])
        assert np.array_equal(placement.layouts[0], expected0)
    counts = row_counts(mask)
    areas = [counts[layout].sum() for layout in placement.layouts]
    assert max(areas) / np.mean(areas) < 1.01
    docs = make_mask("causal_document", 4096, seed=1, **DOCS)
    padded = place(docs, shards, "zigzag")
    assert padded.padding_tokens == sum((-n) % (2 * shards) for n in docs.doc_lengths)


@pytest.mark.parametrize("name", ["causal", "causal_document", "sliding_window", "share_question"])
def test_area_balancer_reaches_the_target_without_document_padding(name):
    mask = make_mask(name, 4096, seed=3)
    placement = place(mask, 8, "area")
    counts = row_counts(mask)
    areas = np.array([counts[layout[layout >= 0]].sum() for layout in placement.layouts])
    assert areas.max() / areas.mean() <= 1.05
    assert placement.padding_tokens < 8 * 8  # only the end, never per document
    assert place(mask, 8, "contiguous").imbalance(mask) >= placement.imbalance(mask)


def test_head_split_replicates_kv_only_as_needed():
    split, why = head_split(64, 8, 16)
    assert why is None and split.kv_replication == 2 and split.local_kv == 1
    split, _ = head_split(24, 6, 4)
    assert split.kv_replication == 2  # 6 heads over 4 ranks: each copy serves 2 query heads
    assert split.kv_heads_of(1) == [1, 2][: split.local_kv] or split.kv_heads_of(1)
    _, why = head_split(64, 8, 6)
    assert "not divisible" in why
    _, why = head_split(8, 1, 4)  # MQA: 1 kv head, GQA group 8, replicate 4x
    assert why is None


def problem(hq=24, hkv=6, d=4, dtype=torch.bfloat16):
    return Problem(8192, 8192, hq, hkv, d, dtype)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ulysses_and_ring_volumes_match_the_paper_formulas(world):
    """Forward volumes against LongCA-bench's Table 3 (per device, elements x 2 bytes)."""
    t, hq, hkv, d = 8192, 24, 6, 4
    mask = make_mask("causal", t)
    pb = problem(hq, hkv, d)
    uly = STRATEGIES.get("ulysses")({"balance": "contiguous"}, 8).plan(mask, pb, world)
    kv_heads = hkv * uly.heads.kv_replication  # K/V replicated to divide over the ranks
    paper_ulysses = (world - 1) / world**2 * t * (kv_heads + hq) * d * 2 * 2  # in, out
    assert uly.comm_bytes["a2a"] == pytest.approx(paper_ulysses, rel=1e-9)
    ring = STRATEGIES.get("ring")({"balance": "contiguous"}, 8).plan(mask, pb, world)
    paper_ring = (world - 1) / world * t * hkv * d * 2 * 2
    assert ring.comm_bytes["ring_kv"] == pytest.approx(paper_ring, rel=1e-9)
    # backward: K/V travel again, and each dK/dV accumulator (fp32) travels once per step
    assert ring.comm_bytes["ring_kv_bwd"] == ring.comm_bytes["ring_kv"]
    assert ring.comm_bytes["ring_dkv"] == world * (t // world) * hkv * d * 2 * 4


def test_usp_volume_is_the_papers():
    t, hq, hkv, d, u, r = 8192, 24, 6, 4, 2, 4
    plan = STRATEGIES.get("usp")({"balance": "contiguous", "ulysses_degree": u}, 8).plan(
        make_mask("causal", t), problem(hq, hkv, d), u * r
    )
    n = u * r
    kv_heads = hkv * plan.heads.kv_replication
    a2a = (u - 1) / (r * u * u) * t * (kv_heads + hq) * d * 2 * 2
    p2p = (r - 1) / (r * u) * t * kv_heads * d * 2 * 2
    assert plan.comm_bytes["a2a"] == pytest.approx(a2a, rel=1e-9)
    assert plan.comm_bytes["usp_ring_kv"] == pytest.approx(p2p, rel=1e-9)
    assert n == 8


def test_loongtrain_splits_the_ring_traffic_into_inner_and_outer():
    plan = STRATEGIES.get("loongtrain")({"balance": "contiguous", "ulysses_degree": 1}, 8).plan(
        make_mask("causal", 8192), problem(), 8
    )
    assert plan.windows == 2  # largest w with w <= 8 / w
    block = 2 * (8192 // 8) * 6 * 4 * 2
    assert plan.comm_bytes["loong_outer_kv"] == 1 * block
    assert plan.comm_bytes["loong_inner_kv"] == 2 * 3 * block
    assert plan.comm_bytes["loong_outer_kv"] + plan.comm_bytes["loong_inner_kv"] == 7 * block


def test_strategies_refuse_what_they_cannot_do():
    pb = problem(64, 8, 128)
    assert "not divisible" in " ".join(STRATEGIES.get("ulysses")({}, 8).reasons(pb, 6))
    assert STRATEGIES.get("ring")({}, 8).reasons(pb, 6) == []
    assert "does not divide" in " ".join(
        STRATEGIES.get("usp")({"ulysses_degree": 4}, 8).reasons(pb, 6)
    )


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.integers(1, 300), min_size=1, max_size=12),
    shards=st.integers(1, 9),
    multiple=st.sampled_from([1, 2, 3, 8]),
)
def test_zigzag_layouts_are_the_per_document_head_tail_pieces(docs, shards, multiple):
    """Each document padded to a multiple of 2P and cut in 2P pieces; shard p gets pieces p and
    2P-1-p of every document in order; every layout padded (-1) to a multiple of ``multiple``."""
    from lcab.cp.balance import zigzag

    chunks = 2 * shards
    expected: list[list[int]] = [[] for _ in range(shards)]
    start = 0
    for length in docs:
        piece = -(-length // chunks)
        tokens = [start + t if t < length else -1 for t in range(piece * chunks)]
        for p in range(shards):
            for q in (p, chunks - 1 - p):
                expected[p] += tokens[q * piece : (q + 1) * piece]
        start += length
    width = -(-len(expected[0]) // multiple) * multiple
    layouts = zigzag(np.array(docs), shards, multiple).layouts
    assert [layout.tolist() for layout in layouts] == [
        e + [-1] * (width - len(e)) for e in expected
    ]
