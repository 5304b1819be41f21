"""`block_table`: tile classification checked against tiles counted on the dense mask.

Expected from the definition (independent of lcab): on a grid of query blocks x key blocks,
a tile is listed iff it holds at least one attended pair, it is full iff every one of its pairs
is attended, its coverage is its number of attended pairs, rows (head, query block) list key
blocks in strictly increasing order, and the partial-tile masks are the dense mask cut to the
tile (False beyond a short edge tile).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import BlockTable, block_table, uniform_bounds
from tests.helpers.masks import (
    ALL_PATTERNS,
    any_masks,
    dense3,
    dense_masks,
    fast,
    pattern_masks,
    restricted,
    slice_masks,
)


# ----------------------------------------------------------------------------- emulator
def offsets(spec: int | np.ndarray, length: int) -> np.ndarray:
    """Block offsets of a uniform size (last block shorter) or an explicit offset array."""
    if isinstance(spec, (int, np.integer)):
        return np.array([*range(0, length, int(spec)), length], dtype=np.int64)
    return np.asarray(spec, dtype=np.int64)


def tile_counts(dense: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(attended pairs per tile (H, nQ, nK), tile areas (nQ, nK)) counted on the dense mask."""
    d = dense.astype(np.int64)
    per_q = np.add.reduceat(d, qb[:-1], axis=1)
    counts = np.add.reduceat(per_q, kb[:-1], axis=2)
    areas = np.diff(qb)[:, None] * np.diff(kb)[None, :]
    return counts, areas


def check_block_table(mask: AttnMask, q_spec, k_spec=None) -> BlockTable:
    dense = dense3(mask)
    H, Sq, Sk = dense.shape
    qb = offsets(q_spec, Sq)
    kb = offsets(q_spec if k_spec is None else k_spec, Sk)
    table = block_table(mask, q_spec, k_spec)
    counts, areas = tile_counts(dense, qb, kb)
    nQ, nK = len(qb) - 1, len(kb) - 1

    assert np.array_equal(table.q_bounds, qb)
    assert np.array_equal(table.k_bounds, kb)
    assert table.num_heads == H == mask.num_heads
    assert (table.num_q_blocks, table.num_k_blocks) == (nQ, nK)

    ptr = np.asarray(table.ptr)
    assert ptr.shape == (H * nQ + 1,)
    assert ptr[0] == 0 and ptr[-1] == len(table.kv_block) and (np.diff(ptr) >= 0).all()
    assert len(table.full) == len(table.coverage) == len(table.kv_block)
    assert np.asarray(table.full).dtype == np.bool_

    for r in range(H * nQ):
        h, q = divmod(r, nQ)
        kv = np.asarray(table.kv_block[ptr[r] : ptr[r + 1]])
        assert (np.diff(kv) > 0).all(), f"row {r}: key blocks not strictly increasing: {kv}"
        expected = np.flatnonzero(counts[h, q] > 0)
        assert np.array_equal(kv, expected), f"row (head {h}, q-block {q}): listed tiles differ"
        cov = np.asarray(table.coverage[ptr[r] : ptr[r + 1]])
        assert np.array_equal(cov, counts[h, q, kv]), f"row {r}: coverage"
        full = np.asarray(table.full[ptr[r] : ptr[r + 1]])
        assert np.array_equal(full, counts[h, q, kv] == areas[q, kv]), f"row {r}: full flags"

    # dense_blocks: 0 empty, 1 partial, 2 full.
    status = np.where(counts == 0, 0, np.where(counts == areas[None], 2, 1)).astype(np.int8)
    db = table.dense_blocks()
    assert db.dtype == torch.int8 and tuple(db.shape) == (H, nQ, nK)
    assert np.array_equal(db.numpy(), status)

    # Derived summaries.
    partial_n, full_n = table.counts()
    assert np.array_equal(partial_n, (status == 1).sum(-1))
    assert np.array_equal(full_n, (status == 2).sum(-1))
    rows = np.repeat(np.arange(H * nQ), np.diff(ptr))
    assert np.array_equal(table.tile_areas(), areas[rows % nQ, table.kv_block])
    grid = table.coverage_grid()
    assert np.allclose(grid, counts / areas[None])

    # Partial tile masks: exactly the dense mask cut to each partial tile, padded with False.
    entries, tiles = table.partial_tile_masks(mask)
    entries = np.asarray(entries)
    assert sorted(entries.tolist()) == np.flatnonzero(~np.asarray(table.full)).tolist()
    bq, bk = int(np.diff(qb).max()), int(np.diff(kb).max())
    assert tiles.dtype == torch.bool
    assert tuple(tiles.shape) == (len(entries), bq, bk)
    tiles = tiles.numpy()
    for n, e in enumerate(entries.tolist()):
        r = int(np.searchsorted(ptr, e, side="right") - 1)
        h, q = divmod(r, nQ)
        k = int(table.kv_block[e])
        want = np.zeros((bq, bk), dtype=bool)
        cut = dense[h, qb[q] : qb[q + 1], kb[k] : kb[k + 1]]
        want[: cut.shape[0], : cut.shape[1]] = cut
        assert np.array_equal(tiles[n], want), f"partial tile (head {h}, q {q}, k {k})"
    return table


# ----------------------------------------------------------------------------- strategies
@st.composite
def block_specs(draw: st.DrawFn, length: int):
    """A uniform block size (possibly larger than the sequence) or random increasing offsets."""
    if draw(st.booleans()):
        return draw(st.integers(1, 12) | st.integers(1, length + 5))
    k = draw(st.integers(1, min(length, 12)))
    cuts = sorted(draw(st.sets(st.integers(1, max(length - 1, 1)), min_size=k - 1, max_size=k - 1)))
    return np.array([0, *cuts, length], dtype=np.int64)


@st.composite
def mask_and_specs(draw: st.DrawFn, masks: st.SearchStrategy[AttnMask]):
    mask = draw(masks)
    q_spec = draw(block_specs(mask.seqlen_q))
    if isinstance(q_spec, int) and draw(st.booleans()):
        return mask, q_spec, None  # k_bounds defaults to q_bounds (a block size)
    if mask.seqlen_q == mask.seqlen_k and draw(st.booleans()):
        return mask, q_spec, None  # same offsets on both sides
    return mask, q_spec, draw(block_specs(mask.seqlen_k))


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(25)
@given(data=st.data())
def test_block_table_patterns(name: str, data: st.DataObject) -> None:
    mask, q_spec, k_spec = data.draw(mask_and_specs(pattern_masks(name)))
    check_block_table(mask, q_spec, k_spec)


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_block_table_restricted(name: str, data: st.DataObject) -> None:
    mask, q_spec, k_spec = data.draw(mask_and_specs(restricted(name)))
    check_block_table(mask, q_spec, k_spec)


@fast(80)
@given(data=st.data())
def test_block_table_random_slices(data: st.DataObject) -> None:
    mask, q_spec, k_spec = data.draw(mask_and_specs(slice_masks(max_heads=3)))
    check_block_table(mask, q_spec, k_spec)


@fast(80)
@given(data=st.data())
def test_block_table_random_dense(data: st.DataObject) -> None:
    mask, q_spec, k_spec = data.draw(mask_and_specs(dense_masks(max_heads=3)))
    check_block_table(mask, q_spec, k_spec)


def test_block_table_examples() -> None:
    """Hand-checked tiles of a causal mask on 4 x 4 blocks of size 2 (and a short last block)."""
    t = check_block_table(make_mask("causal", 8), 2)
    expected = np.array([[1, 0, 0, 0], [2, 1, 0, 0], [2, 2, 1, 0], [2, 2, 2, 1]], dtype=np.int8)
    assert np.array_equal(t.dense_blocks().numpy()[0], expected)
    assert t.coverage.tolist() == [3, 4, 3, 4, 4, 3, 4, 4, 4, 3]
    t = check_block_table(make_mask("causal", 7), 3)  # blocks 3, 3, 1
    assert t.dense_blocks().numpy()[0].tolist() == [[1, 0, 0], [2, 1, 0], [2, 2, 2]]
    assert t.coverage.tolist() == [6, 9, 6, 3, 3, 1]


def test_block_table_full_mask_all_full() -> None:
    t = check_block_table(make_mask("full", 50), 16, 7)
    assert np.asarray(t.full).all()
    assert len(t.kv_block) == 4 * 8


def test_block_table_empty_mask() -> None:
    mask = AttnMask.from_dense(np.zeros((5, 9), dtype=bool))
    t = check_block_table(mask, 2, 4)
    assert len(t.kv_block) == 0 and np.array_equal(t.ptr, np.zeros(4, dtype=np.int64))
    entries, tiles = t.partial_tile_masks(mask)
    assert len(entries) == 0 and tiles.shape[0] == 0


def test_uniform_bounds() -> None:
    assert uniform_bounds(10, 4).tolist() == [0, 4, 8, 10]
    assert uniform_bounds(8, 4).tolist() == [0, 4, 8]
    assert uniform_bounds(3, 100).tolist() == [0, 3]
    with pytest.raises(ValueError):
        uniform_bounds(10, 0)


@pytest.mark.parametrize(
    "q_bounds",
    [
        [0, 5, 5, 10],  # not strictly increasing
        [0, 6, 4, 10],
        [1, 5, 10],  # does not start at 0
        [0, 5, 9],  # does not end at seqlen
        [0, 5, 11],
    ],
)
def test_block_table_rejects_bad_offsets(q_bounds: list[int]) -> None:
    mask = make_mask("causal", 10)
    with pytest.raises(ValueError):
        block_table(mask, np.array(q_bounds))
    with pytest.raises(ValueError):
        block_table(mask, 5, np.array(q_bounds))


def test_block_table_rejects_block_size_zero() -> None:
    with pytest.raises(ValueError):
        block_table(make_mask("causal", 10), 0)


@fast(40)
@given(mask=any_masks(), block=st.integers(1, 40))
def test_block_table_coverage_sums_to_area(mask: AttnMask, block: int) -> None:
    """Tiles partition the grid, so the coverages of each head add up to its area."""
    t = block_table(mask, block)
    rows = np.repeat(np.arange(len(t.ptr) - 1), np.diff(t.ptr))
    per_head = np.bincount(rows // t.num_q_blocks, weights=t.coverage, minlength=mask.num_heads)
    assert per_head.astype(np.int64).tolist() == dense3(mask).sum((1, 2)).tolist()


@pytest.mark.parametrize("block", [np.int64(16), np.int32(16)])
def test_block_table_numpy_integer_block_size(block) -> None:
    mask = make_mask("causal", 64)
    check_block_table(mask, block)
    assert block_table(mask, block).q_bounds.tolist() == [0, 16, 32, 48, 64]
