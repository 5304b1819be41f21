"""The published document cells' packs: the benchmark's sampler, drawn again."""

import numpy as np
import pytest

from lcab.plan.blog_packs import CHUNK_RATIO, blog_packs, chatqa_documents, packs_from
from lcab.plan.hardware import load_profile
from lcab.plan.published import compare, paper_cell


def one_by_one(lengths, counts, pack_len, seed, take):
    """The sampler as the benchmark describes it: pieces packed one at a time, carrying over."""
    rng = np.random.default_rng(seed)
    chunk = pack_len * CHUNK_RATIO
    pieces = []
    for length, count in zip(lengths.tolist(), counts.tolist(), strict=True):
        pieces += [int(chunk)] * (int(length // chunk) * count)
    for length, count in zip(lengths.tolist(), counts.tolist(), strict=True):
        if length % chunk:
            pieces += [int(length % chunk)] * count
    pieces = np.array(pieces, dtype=np.int32)
    rng.shuffle(pieces)
    pieces = pieces.tolist()
    packs, i, carry = [], 0, 0
    for _ in range(sum(pieces) // pack_len):
        pack, left = [], pack_len
        if carry:
            pack, left, carry = [carry], left - carry, 0
        while left > 0 and i < len(pieces):
            if pieces[i] <= left:
                pack.append(pieces[i])
                left -= pieces[i]
            else:
                pack.append(left)
                carry, left = pieces[i] - left, 0
            i += 1
        packs.append(pack)
    rng.shuffle(packs)
    return packs[:take]


@pytest.mark.parametrize("pack_len", [64, 256, 1000])
def test_cutting_the_stream_packs_as_one_by_one_with_carry_over(pack_len):
    lengths = np.array([3, 17, 40, 90, 250, 600], dtype=np.int32)
    counts = np.array([50, 30, 20, 9, 4, 2], dtype=np.int64)
    expected = one_by_one(lengths, counts, pack_len, seed=7, take=12)
    assert packs_from(lengths, counts, pack_len, seed=7, take=12) == expected


def test_chatqa_documents_are_the_benchmark_bins_midpoints():
    lengths, counts = chatqa_documents()
    # the benchmark's CSV: first bin "[0, 10]" 30254 documents, last "[131073, 196608]" 18284
    assert (lengths[0], counts[0]) == (5, 30254)
    assert (lengths[-1], counts[-1]) == ((131073 + 196608) // 2, 18284)
    assert len(lengths) == 14 and np.all(np.diff(lengths) > 0)


def test_blog_packs_fill_the_pack_with_pieces_no_longer_than_a_quarter():
    packs = blog_packs(8192 * 8)
    assert len(packs) == 20
    for pack in packs:
        assert sum(pack) == 65536 and min(pack) >= 1 and max(pack) <= 65536 // 4


def test_document_cells_hold_the_blog_packs_and_other_masks_none():
    cell = paper_cell("causal_document", "ring", 16, sample=3)
    assert cell.mask_params["doc_lengths"] == list(blog_packs(8192 * 16)[3])
    assert cell.seqlen == 8192 * 16 and paper_cell("full", "ring", 16).mask_params == {}


def test_compare_rejects_more_samples_than_the_blog_has():
    with pytest.raises(ValueError, match="samples=21"):
        compare(load_profile("h100_nvlink_ib"), worlds=(8,), samples=21, workers=1)
