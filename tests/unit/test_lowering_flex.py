"""FlexAttention lowering: the BlockMask is materialised by hand and compared with the dense mask.

Materialisation follows FlexAttention's semantics of a BlockMask: for query head h and query
block qb, tiles listed in ``full_kv_indices[0, h, qb, :full_kv_num_blocks[0, h, qb]]`` are
attended everywhere, tiles listed in ``kv_indices[0, h, qb, :kv_num_blocks[0, h, qb]]`` are
attended where ``mask_mod(b, h, q_idx, kv_idx)`` is True, every other tile is masked. Query head
h of a per-KV-head mask uses mask head ``h // (heads_q / H)``; a head-shared mask gives a
BlockMask with one head. The query-major fields must list the same tiles, transposed.

End to end, eager ``flex_attention`` in float64 must equal softmax attention under the dense
mask. Eager flex evaluates ``mask_mod`` at every position (the tile lists only matter for the
compiled kernels), so that check covers the predicate; the materialisation covers the tiles.
Rows with no attended key: FlexAttention documents an output of 0 for them; the reference uses 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import flex_attention

from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import flex_block_mask, flex_mask_mod
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

BLOCK_SIZES = st.sampled_from([8, 16, 32, 64, 128]) | st.integers(1, 48)


# ----------------------------------------------------------------------------- emulator
def eval_mask_mod(mask_mod, head: int, sq: int, sk: int) -> np.ndarray:
    """mask_mod at every (q, kv) position of query head ``head`` (broadcast index grids)."""
    out = mask_mod(
        torch.tensor(0),
        torch.tensor(head),
        torch.arange(sq)[:, None],
        torch.arange(sk)[None, :],
    )
    assert out.dtype == torch.bool
    return out.expand(sq, sk).numpy()


def listed(num: torch.Tensor, idx: torch.Tensor, h: int, row: int, n_cols: int) -> list[int]:
    """The first num[0, h, row] entries of idx[0, h, row]; checked distinct and in range."""
    count = int(num[0, h, row])
    assert 0 <= count <= idx.shape[-1]
    cols = idx[0, h, row, :count].tolist()
    assert len(set(cols)) == len(cols), f"duplicate blocks {cols}"
    assert all(0 <= c < n_cols for c in cols), f"block out of range in {cols}"
    return cols


def materialise(bm, sq: int, sk: int) -> tuple[np.ndarray, np.ndarray, set]:
    """(dense (Hb, Sq, Sk), tile status (Hb, nQ, nK) 0/1 partial/2 full, kv-major tile set)."""
    bq, bk = bm.BLOCK_SIZE
    nq, nk = math.ceil(sq / bq), math.ceil(sk / bk)
    heads = bm.kv_num_blocks.shape[1]
    assert tuple(bm.kv_num_blocks.shape) == (1, heads, nq)
    assert tuple(bm.full_kv_num_blocks.shape) == (1, heads, nq)
    # FlexAttention reads the number of key blocks from the last dimension of the indices.
    assert tuple(bm.kv_indices.shape) == (1, heads, nq, nk)
    assert tuple(bm.full_kv_indices.shape) == (1, heads, nq, nk)
    out = np.zeros((heads, sq, sk), dtype=bool)
    status = np.zeros((heads, nq, nk), dtype=np.int8)
    tiles = set()
    for h in range(heads):
        pred = eval_mask_mod(bm.mask_mod, h, sq, sk)
        for qb in range(nq):
            qs = slice(qb * bq, min((qb + 1) * bq, sq))
            full = listed(bm.full_kv_num_blocks, bm.full_kv_indices, h, qb, nk)
            part = listed(bm.kv_num_blocks, bm.kv_indices, h, qb, nk)
            assert not set(full) & set(part), f"tile both full and partial: head {h} q {qb}"
            for kb in full:
                ks = slice(kb * bk, min((kb + 1) * bk, sk))
                out[h, qs, ks] = True
                status[h, qb, kb] = 2
                tiles.add((h, qb, kb, True))
            for kb in part:
                ks = slice(kb * bk, min((kb + 1) * bk, sk))
                out[h, qs, ks] = pred[qs, ks]
                status[h, qb, kb] = 1
                tiles.add((h, qb, kb, False))
    return out, status, tiles


def q_major_tiles(bm, sq: int, sk: int) -> set:
    """Tiles listed by the query-major fields, as (head, q-block, k-block, full)."""
    bq, bk = bm.BLOCK_SIZE
    nq, nk = math.ceil(sq / bq), math.ceil(sk / bk)
    heads = bm.kv_num_blocks.shape[1]
    assert tuple(bm.q_num_blocks.shape) == (1, heads, nk)
    assert tuple(bm.q_indices.shape) == (1, heads, nk, nq)
    assert tuple(bm.full_q_num_blocks.shape) == (1, heads, nk)
    assert tuple(bm.full_q_indices.shape) == (1, heads, nk, nq)
    tiles = set()
    for h in range(heads):
        for kb in range(nk):
            for qb in listed(bm.q_num_blocks, bm.q_indices, h, kb, nq):
                tiles.add((h, qb, kb, False))
            for qb in listed(bm.full_q_num_blocks, bm.full_q_indices, h, kb, nq):
                tiles.add((h, qb, kb, True))
    return tiles


def expected_status(dense: np.ndarray, bq: int, bk: int) -> np.ndarray:
    """Tile status from the dense mask: 0 empty, 1 partial, 2 every in-range pair attended."""
    _, sq, sk = dense.shape
    qb = np.arange(0, sq, bq)
    kb = np.arange(0, sk, bk)
    counts = np.add.reduceat(np.add.reduceat(dense.astype(np.int64), qb, axis=1), kb, axis=2)
    areas = np.diff([*qb, sq])[:, None] * np.diff([*kb, sk])[None, :]
    return np.where(counts == 0, 0, np.where(counts == areas, 2, 1)).astype(np.int8)


def mask_heads_for(mask: AttnMask, heads_q: int | None) -> tuple[int, int]:
    """(BlockMask heads, query heads per mask head) expected for ``heads_q``."""
    if mask.num_heads == 1:
        return 1, 1
    assert heads_q is not None
    return heads_q, heads_q // mask.num_heads


def check_flex(mask: AttnMask, block_size: int, group: int) -> None:
    dense = dense3(mask)
    H, sq, sk = dense.shape
    heads_q = H * group if H > 1 else (group if group > 1 else None)
    bm = flex_block_mask(mask, heads_q=heads_q, block_size=block_size)
    n_heads, g = mask_heads_for(mask, heads_q)
    assert tuple(bm.seq_lengths) == (sq, sk)
    assert tuple(bm.BLOCK_SIZE) == (block_size, block_size)
    got, status, kv_tiles = materialise(bm, sq, sk)
    assert got.shape[0] == n_heads
    want = np.stack([dense[h // g] for h in range(n_heads)])
    for h in range(n_heads):
        if not np.array_equal(got[h], want[h]):
            bad = np.argwhere(got[h] != want[h])[0]
            raise AssertionError(
                f"query head {h}: BlockMask differs from the dense mask first at (q, k) = "
                f"{tuple(bad.tolist())}: got {got[h][tuple(bad)]}"
            )
    # Tiles: every non-empty tile is listed, fully-attended tiles as full (no mask_mod needed).
    exp = np.stack([expected_status(dense, block_size, block_size)[h // g] for h in range(n_heads)])
    assert np.array_equal(status, exp)
    assert q_major_tiles(bm, sq, sk) == kv_tiles


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_flex_block_mask_patterns(name: str, data: st.DataObject) -> None:
    mask = data.draw(pattern_masks(name))
    check_flex(mask, data.draw(BLOCK_SIZES), data.draw(st.integers(1, 3)))


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_flex_block_mask_restricted(name: str, data: st.DataObject) -> None:
    mask = data.draw(restricted(name))
    check_flex(mask, data.draw(BLOCK_SIZES), data.draw(st.integers(1, 3)))


@fast(50)
@given(
    mask=st.one_of(slice_masks(max_heads=3), dense_masks(max_heads=3)),
    block=BLOCK_SIZES,
    group=st.integers(1, 3),
)
def test_flex_block_mask_random(mask: AttnMask, block: int, group: int) -> None:
    check_flex(mask, block, group)


@fast(60)
@given(mask=any_masks(), group=st.integers(1, 3))
def test_flex_mask_mod_exact_everywhere(mask: AttnMask, group: int) -> None:
    """The compact predicate is exact at every position, not only inside partial tiles."""
    dense = dense3(mask)
    H, sq, sk = dense.shape
    heads_q = H * group
    mm = flex_mask_mod(mask, heads_q=heads_q if H > 1 else None)
    assert mm.form in ("intervals", "grid")
    fn = mm.as_mask_mod()
    for h in range(heads_q if H > 1 else 1):
        assert np.array_equal(eval_mask_mod(fn, h, sq, sk), dense[h // group]), f"head {h}"


def test_flex_mask_mod_both_forms() -> None:
    """Block-aligned full rectangles may use the grid form; bands need intervals. Both exact."""
    forms = set()
    for mask in (
        make_mask("block_sparse", 256, seed=1, block_size=16, density=0.3, heads=2),
        make_mask("sliding_window", 100, window=7),
        make_mask("causal_document", 120, doc_lengths=[50, 30, 40]),
    ):
        mm = flex_mask_mod(mask, heads_q=4 if mask.num_heads > 1 else None)
        forms.add(mm.form)
        dense = dense3(mask)
        for h in range(4 if mask.num_heads > 1 else 1):
            got = eval_mask_mod(mm.as_mask_mod(), h, *dense.shape[1:])
            assert np.array_equal(got, dense[h // 2 if mask.num_heads > 1 else 0])
    assert "intervals" in forms


@pytest.mark.parametrize("heads_q", [None, 3, 5])
def test_flex_per_head_mask_needs_multiple_heads_q(heads_q: int | None) -> None:
    mask = make_mask("block_sparse", 64, block_size=16, density=0.5, heads=2)
    with pytest.raises(ValueError):
        flex_block_mask(mask, heads_q=heads_q, block_size=16)
    with pytest.raises(ValueError):
        flex_mask_mod(mask, heads_q=heads_q)


def test_flex_head_shared_mask_has_one_head() -> None:
    bm = flex_block_mask(make_mask("causal", 70), heads_q=8, block_size=16)
    assert bm.kv_num_blocks.shape[1] == 1
    default = flex_block_mask(make_mask("causal", 300))  # Flex's default tile: 128 x 128
    assert tuple(default.BLOCK_SIZE) == (128, 128)
    check_flex(make_mask("causal", 300), 128, 1)


# ----------------------------------------------------------------------------- end to end
def reference_attention(q, k, v, dense: np.ndarray, group_mask: int) -> torch.Tensor:
    """Softmax attention in float64; query head h uses KV head h // G and mask head h // G_m."""
    hq, hk = q.shape[1], k.shape[1]
    kk = k.repeat_interleave(hq // hk, dim=1)
    vv = v.repeat_interleave(hq // hk, dim=1)
    m = torch.from_numpy(np.stack([dense[h // group_mask] for h in range(hq)]))[None]
    scores = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~m, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # rows with no attended key: output 0
    return p @ vv


def check_end_to_end(mask: AttnMask, block_size: int, group: int, seed: int) -> None:
    dense = dense3(mask)
    H, sq, sk = dense.shape
    if H > 1:
        hkv, hq = H, H * group  # mask heads are KV heads
    else:
        hkv = 1 + seed % 2
        hq = hkv * group
    gen = torch.Generator().manual_seed(seed)
    D = 16
    q = torch.randn(1, hq, sq, D, dtype=torch.float64, generator=gen)
    k = torch.randn(1, hkv, sk, D, dtype=torch.float64, generator=gen)
    v = torch.randn(1, hkv, sk, D, dtype=torch.float64, generator=gen)
    bm = flex_block_mask(mask, heads_q=hq if H > 1 else None, block_size=block_size)
    out = flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    ref = reference_attention(q, k, v, dense, group if H > 1 else hq)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


@fast(6)
@given(
    mask=any_masks(max_seqlen=120),
    block=st.sampled_from([16, 32, 128]),
    group=st.integers(1, 2),
    seed=st.integers(0, 1000),
)
def test_flex_attention_end_to_end(mask: AttnMask, block: int, group: int, seed: int) -> None:
    check_end_to_end(mask, block, group, seed)


@pytest.mark.parametrize("name", ALL_PATTERNS)
def test_flex_attention_end_to_end_patterns(name: str) -> None:
    """One mid-sized example of every pattern (S = 200, default tile size 128)."""
    from tests.helpers.mask_reference import reference_of

    mask = make_mask(name, 200, seed=3, **reference_of(name).example)
    check_end_to_end(mask, 128, 2, seed=0)
    check_flex(mask, 128, 2)
