"""Every registered mask pattern against an independent brute-force definition of its set.

Parametrised over ``list_masks()`` so a newly registered pattern is picked up automatically; its
reference (`tests.helpers.mask_reference.REFERENCES`: the attended set, or the structure of a
random pattern) must be registered too, or its cases fail naming what is missing.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.masks import AttnMask, get_pattern, list_masks, make_mask
from tests.helpers.mask_reference import check_doc_lengths, reference_of

ALL = list_masks()
FAST = settings(max_examples=40, deadline=None)


def dense_np(mask: AttnMask) -> np.ndarray:
    dense = mask.to_dense().numpy()
    assert dense.dtype == np.bool_
    return dense if dense.ndim == 3 else dense[None]


# ----------------------------------------------------------------------------- registry
def test_registry_has_the_alias() -> None:
    assert "document" not in ALL  # alias, not a canonical name
    assert len(ALL) == len(set(ALL))
    doc = make_mask("document", 300, seed=3, doc_source="uniform", min_doc_len=5, max_doc_len=50)
    ref = make_mask(
        "causal_document", 300, seed=3, doc_source="uniform", min_doc_len=5, max_doc_len=50
    )
    assert doc.name == "causal_document"
    assert doc == ref and np.array_equal(doc.slices, ref.slices)
    assert get_pattern("document").param_names() == get_pattern("causal_document").param_names()


@pytest.mark.parametrize("name", ALL)
def test_document_patterns_share_document_params(name: str) -> None:
    """The reference's view (built from packed documents) is the pattern's own."""
    shared = {
        "doc_source",
        "doc_lengths",
        "doc_len",
        "min_doc_len",
        "max_doc_len",
        "long_fraction",
        "long_min_len",
        "long_max_len",
        "histogram_file",
        "histogram_name",
    }
    documents = reference_of(name).documents
    assert documents == get_pattern(name).uses_documents
    assert (shared <= set(get_pattern(name).param_names())) == documents


# ----------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("name", ALL)
@FAST
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_pattern_matches_definition(name: str, data: st.DataObject, seed: int) -> None:
    reference = reference_of(name)
    seqlen, params = data.draw(reference.params(160), label="seqlen, params")
    mask = make_mask(name, seqlen, seed=seed, **params)
    dense = dense_np(mask)
    H = dense.shape[0]

    # Generic invariants, for every pattern.
    assert mask.shape == (seqlen, seqlen) == (mask.seqlen_q, mask.seqlen_k)
    assert dense.shape[1:] == (seqlen, seqlen)
    assert mask.num_heads == H == len(mask.head_ptr) - 1
    assert mask.area() == int(dense.sum())
    assert [mask.head(h).area() for h in range(mask.num_heads)] == dense.sum(axis=(1, 2)).tolist()
    assert math.isclose(mask.density(), dense.sum() / (H * seqlen * seqlen))
    assert mask.name == name and mask.seed == seed

    if reference.documents:
        check_doc_lengths(mask, seqlen, params)
    if reference.dense is not None:
        assert H == 1
        expected = reference.dense(seqlen, mask.params, mask.doc_lengths)
        expected = np.broadcast_to(expected, (seqlen, seqlen))
        mismatch = np.argwhere(expected != dense[0])
        assert len(mismatch) == 0, f"first mismatching (i, j): {mismatch[:5].tolist()}"
        assert mask.area() == int(expected.sum())
    if reference.check is not None:
        reference.check(mask, dense, seqlen, params)
    assert reference.dense is not None or reference.check is not None, "a reference checks"


@pytest.mark.parametrize(("density", "heads"), [(0.2, 2), (0.5, 1), (0.8, 3)])
def test_varblock_sparse_density_close_to_target(density: float, heads: int) -> None:
    # 128 column blocks of random sizes (mean 16 tokens, >= 4) and 128 row blocks that each keep
    # floor(rho * 128) of them at random: the attended fraction averages ~128 x k random column
    # blocks per head, so its deviation from k/128 is ~1 % (a few sigma below 0.03).
    seqlen = 2048
    mask = make_mask(
        "varblock_sparse",
        seqlen,
        seed=11,
        avg_block_size=16,
        min_block_size=4,
        density=density,
        heads=heads,
    )
    dense = dense_np(mask)
    assert mask.num_heads == heads
    per_head = dense.mean(axis=(1, 2))
    assert np.abs(per_head - density).max() < 0.03, per_head
    assert mask.area() == int(dense.sum())
    assert abs(mask.density() - density) < 0.03


def test_block_sparse_heads_are_independent() -> None:
    # 4 heads of a 32 x 32 block grid keeping 16 of 32 per row: identical random picks in two
    # heads would have probability C(32,16)^-32, i.e. never by chance.
    mask = make_mask("block_sparse", 1024, seed=5, block_size=32, density=0.5, heads=4)
    dense = dense_np(mask)
    assert dense.shape == (4, 1024, 1024)
    for a in range(4):
        for b in range(a + 1, 4):
            assert not np.array_equal(dense[a], dense[b])
    assert mask.area() == 4 * 32 * 16 * 32 * 32


def test_block_sparse_last_block_shorter() -> None:
    # S=100, B=32: blocks of 32, 32, 32, 4; density 1 keeps everything.
    mask = make_mask("block_sparse", 100, block_size=32, density=1.0)
    assert mask.area() == 100 * 100
    # density 0.25 -> max(1, floor(0.25 * 4)) = 1 block per row block.
    mask = make_mask("block_sparse", 100, block_size=32, density=0.25, seed=2)
    dense = dense_np(mask)[0]
    kept = dense[::32, ::32]
    assert (kept.sum(axis=1) == 1).all()


def test_hand_checked_examples() -> None:
    # causal S=4: lower triangle incl. diagonal, area 10.
    assert make_mask("causal", 4).to_dense().int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ]
    # documents [2, 3]: two causal blocks, area 3 + 6.
    cd = make_mask("causal_document", 5, doc_lengths=[2, 3])
    assert cd.to_dense().int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert cd.area() == 9
    # share_question, documents [2, 1, 2]: answers see both question tokens.
    sq = make_mask("share_question", 5, doc_lengths=[2, 1, 2])
    assert sq.to_dense().int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]
    # causal_blockwise, documents [1, 2, 2]: the last document sees everything before it.
    cb = make_mask("causal_blockwise", 5, doc_lengths=[1, 2, 2])
    assert cb.to_dense().int().tolist() == [
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    # sliding_window_causal w=1, S=4: diagonal and the one below.
    assert make_mask("sliding_window_causal", 4, window=1).area() == 4 + 3
    # sliding_window w=1, S=4: tridiagonal.
    assert make_mask("sliding_window", 4, window=1).area() == 4 + 3 + 3
    # global_sliding_window S=6, w=0, g=1: row 0, column 0 and the diagonal: 6 + 5 + 5.
    assert make_mask("global_sliding_window", 6, window=0, global_tokens=1).area() == 16
    # prefix_lm_causal S=4, p=2: the 2x2 prefix block plus the causal rest: 4 + 3 + 4.
    assert make_mask("prefix_lm_causal", 4, prefix=2).area() == 11
    # prefix_lm_document, docs [3, 2], p=2: doc 0 -> 4 + 3, doc 1 -> 4 (whole doc is prefix).
    assert make_mask("prefix_lm_document", 5, doc_lengths=[3, 2], prefix=2).area() == 11
    # block_causal_document B=2 and one document of 4 blocks (min=max=4) at S=8:
    # block rows see 1, 2, 3, 4 blocks of 2x2 -> 4 * (1 + 2 + 3 + 4) = 40.
    bc = make_mask("block_causal_document", 8, block_size=2, min_blocks=4, max_blocks=4)
    assert bc.doc_lengths.tolist() == [8]
    assert bc.area() == 40


def test_block_causal_document_every_document_has_min_blocks() -> None:
    # 10 blocks, 3..4 blocks per document: valid splits exist (3+3+4, 3+4+3, 4+3+3).
    bad = []
    for seed in range(30):
        mask = make_mask(
            "block_causal_document", 10, seed=seed, block_size=1, min_blocks=3, max_blocks=4
        )
        blocks = mask.doc_lengths.tolist()
        if not all(3 <= b <= 4 for b in blocks):
            bad.append((seed, blocks))
    assert not bad, f"(seed, blocks per document) violating min_blocks=3: {bad[:5]}"


@pytest.mark.parametrize(
    ("seqlen", "block_size", "min_blocks", "max_blocks"),
    [(4, 1, 3, 3), (5, 1, 3, 4), (7, 1, 4, 6), (2 * 64, 64, 3, 8)],
)
def test_block_causal_document_unsplittable_rejected(
    seqlen: int, block_size: int, min_blocks: int, max_blocks: int
) -> None:
    # No split of seqlen / block_size blocks into documents of min..max blocks exists (e.g.
    # 5 = 3 + 2 or 4 + 1), so no mask can satisfy the pattern's contract.
    with pytest.raises(ValueError, match="min_blocks"):
        make_mask(
            "block_causal_document",
            seqlen,
            block_size=block_size,
            min_blocks=min_blocks,
            max_blocks=max_blocks,
        )


# ----------------------------------------------------------------------------- reproducibility
@pytest.mark.parametrize("name", ALL)
@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_same_inputs_same_mask_and_replay_from_params(
    name: str, data: st.DataObject, seed: int
) -> None:
    seqlen, params = data.draw(reference_of(name).params(160), label="seqlen, params")
    a = make_mask(name, seqlen, seed=seed, **params)
    b = make_mask(name, seqlen, seed=seed, **params)
    assert a == b
    assert np.array_equal(a.slices, b.slices) and np.array_equal(a.head_ptr, b.head_ptr)
    if a.doc_lengths is not None:
        assert np.array_equal(a.doc_lengths, b.doc_lengths)
    # The recorded name, seed and resolved params rebuild the same mask.
    assert set(params) <= set(a.params)
    assert set(a.params) <= set(get_pattern(name).param_names())
    replay = make_mask(a.name, seqlen, seed=a.seed, **a.params)
    assert replay == a
    assert np.array_equal(replay.to_dense().numpy(), a.to_dense().numpy())


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("causal_document", {}),
        ("full_document", {"doc_source": "uniform", "min_doc_len": 64, "max_doc_len": 512}),
        # With two documents both of these equal the plain causal mask, and the default
        # (Pile) packs of 2048 tokens often hold one or two documents: use many documents.
        ("share_question", {"doc_source": "uniform", "min_doc_len": 64, "max_doc_len": 512}),
        ("causal_blockwise", {"doc_source": "uniform", "min_doc_len": 64, "max_doc_len": 512}),
        ("prefix_lm_document", {}),
        ("block_causal_document", {"block_size": 64}),
        ("block_sparse", {"block_size": 64}),
        ("varblock_sparse", {"avg_block_size": 128, "min_block_size": 32}),
    ],
)
def test_different_seeds_give_different_masks(name: str, params: dict[str, Any]) -> None:
    # 20 seeds at S=2048. A collision of two random packs/picks is possible (e.g. two seeds
    # both drawing one document longer than S) but rare; demand at least 15 distinct masks.
    # Attended sets are compared through a digest of the dense mask.
    digests = {
        hashlib.sha256(
            make_mask(name, 2048, seed=seed, **params).to_dense().numpy().tobytes()
        ).hexdigest()
        for seed in range(20)
    }
    assert len(digests) >= 15


def test_prefix_lm_causal_draws_prefix_and_records_it() -> None:
    prefixes = {make_mask("prefix_lm_causal", 1000, seed=s).params["prefix"] for s in range(20)}
    assert len(prefixes) >= 15  # drawn, not a constant
    assert all(0 <= p <= 1000 for p in prefixes)
