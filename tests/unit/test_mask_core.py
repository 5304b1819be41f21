"""`AttnMask` itself: slice kinds, validation, dense round trips, equality, restrict, transpose.

The reference for a slice is written from the kind definitions (local row i in [0, m), local
column j in [0, n)): full = all; causal = j <= i + (n - m); inv_causal = j >= i; bi_causal = both.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.masks import AttnMask, list_masks, make_mask
from tests.helpers.mask_reference import pattern_params
from tests.helpers.masks import rectangles

FAST = settings(max_examples=60, deadline=None)


# ----------------------------------------------------------------------------- reference
def slice_dense(sl: list[int], sq: int, sk: int) -> np.ndarray:
    """Attended pairs of one slice, as a bool (sq, sk) array in global coordinates."""
    q0, q1, k0, k1, kind = sl
    m, n = q1 - q0, k1 - k0
    i = np.arange(m)[:, None]
    j = np.arange(n)[None, :]
    causal = j <= i + (n - m)
    inv = j >= i
    local = {
        0: np.ones((m, n), bool),
        1: causal,
        2: np.broadcast_to(inv, (m, n)),
        3: causal & inv,
    }[kind]
    out = np.zeros((sq, sk), bool)
    out[q0:q1, k0:k1] = local
    return out


@st.composite
def shapes(draw: st.DrawFn, max_len: int = 10) -> tuple[int, int]:
    return draw(st.integers(1, max_len)), draw(st.integers(1, max_len))


@st.composite
def any_slice(draw: st.DrawFn, sq: int, sk: int) -> list[int]:
    q0 = draw(st.integers(0, sq - 1))
    q1 = draw(st.integers(q0 + 1, sq))
    k0 = draw(st.integers(0, sk - 1))
    k1 = draw(st.integers(k0 + 1, sk))
    return [q0, q1, k0, k1, draw(st.integers(0, 3))]


@st.composite
def disjoint_slices(draw: st.DrawFn, sq: int, sk: int, max_candidates: int = 12) -> list[list[int]]:
    """A random set of non-empty, pairwise disjoint slices (greedy over random candidates)."""
    cands = draw(st.lists(any_slice(sq, sk), min_size=1, max_size=max_candidates))
    kept: list[list[int]] = []
    covered = np.zeros((sq, sk), bool)
    for c in cands:
        d = slice_dense(c, sq, sk)
        if d.any() and not (d & covered).any():
            kept.append(c)
            covered |= d
    return kept


@st.composite
def valid_masks(draw: st.DrawFn, max_len: int = 10) -> tuple[AttnMask, np.ndarray]:
    """A hand-built mask (1-3 heads) of random disjoint slices, with its reference (H, Sq, Sk)."""
    sq, sk = draw(shapes(max_len))
    heads = draw(st.integers(1, 3))
    parts = [draw(disjoint_slices(sq, sk)) for _ in range(heads)]
    if not any(parts):
        parts[0] = [[0, sq, 0, sk, 0]]
    dense = np.zeros((heads, sq, sk), bool)
    for h, part in enumerate(parts):
        for s in part:
            dense[h] |= slice_dense(s, sq, sk)
    slices = [s for p in parts for s in p]
    ptr = np.cumsum([0] + [len(p) for p in parts])
    mask = AttnMask(np.array(slices, dtype=np.int64).reshape(-1, 5), sq, sk, head_ptr=ptr)
    return mask, dense


def as3d(mask: AttnMask) -> np.ndarray:
    d = mask.to_dense().numpy()
    return d if d.ndim == 3 else d[None]


def make_pattern(name: str, data: st.DataObject, seed: int) -> AttnMask:
    seqlen, params = data.draw(pattern_params(name, max_seqlen=100), label="seqlen, params")
    return make_mask(name, seqlen, seed=seed, **params)


# ----------------------------------------------------------------------------- slice kinds
@FAST
@given(data=st.data())
def test_single_slice_matches_kind_definition(data: st.DataObject) -> None:
    sq, sk = data.draw(shapes(12))
    sl = data.draw(any_slice(sq, sk))
    ref = slice_dense(sl, sq, sk)
    if not ref.any():
        with pytest.raises(ValueError, match="attends nothing"):
            AttnMask([sl], sq, sk)
        return
    mask = AttnMask([sl], sq, sk)
    assert mask.shape == (sq, sk)
    assert mask.num_heads == 1 and mask.num_slices == 1
    assert np.array_equal(mask.to_dense().numpy(), ref)
    assert mask.area() == int(ref.sum())


def test_kind_examples_by_hand() -> None:
    # 3 rows x 5 columns: causal is bottom-right aligned (offset n - m = 2).
    assert AttnMask([[0, 3, 0, 5, 1]], 3, 5).to_dense().int().tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    # inv_causal is top-left aligned.
    assert AttnMask([[0, 3, 0, 5, 2]], 3, 5).to_dense().int().tolist() == [
        [1, 1, 1, 1, 1],
        [0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1],
    ]
    # bi_causal: the band between both diagonals.
    assert AttnMask([[0, 3, 0, 5, 3]], 3, 5).to_dense().int().tolist() == [
        [1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    # causal with more rows than columns: the first rows are empty.
    assert AttnMask([[0, 4, 0, 2, 1]], 4, 2).to_dense().int().tolist() == [
        [0, 0],
        [0, 0],
        [1, 0],
        [1, 1],
    ]
    # Slices are placed in global coordinates.
    assert AttnMask([[1, 3, 2, 4, 1]], 4, 5).to_dense().int().tolist() == [
        [0, 0, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0],
    ]


# ----------------------------------------------------------------------------- validation
def test_causal_plus_strictly_upper_inv_causal_is_accepted() -> None:
    # inv_causal over [0,3) x [1,4) attends j >= i + 1: strictly above the causal diagonal.
    mask = AttnMask([[0, 4, 0, 4, 1], [0, 3, 1, 4, 2]], 4)
    assert mask.area() == 16
    assert mask.to_dense().all()
    assert mask == AttnMask([[0, 4, 0, 4, 0]], 4)


def test_overlapping_slices_rejected_naming_both() -> None:
    with pytest.raises(ValueError, match="overlap") as err:
        AttnMask([[0, 4, 0, 4, 1], [0, 4, 0, 4, 2]], 4)  # share the diagonal
    assert "[0, 4, 0, 4, 1]" in str(err.value) and "[0, 4, 0, 4, 2]" in str(err.value)
    # Overlap of a single pair (3, 3) between two otherwise separate slices.
    with pytest.raises(ValueError, match="overlap") as err:
        AttnMask([[0, 2, 0, 2, 0], [3, 5, 3, 5, 1], [2, 4, 2, 4, 0]], 5)
    assert "[3, 5, 3, 5, 1]" in str(err.value) and "[2, 4, 2, 4, 0]" in str(err.value)


def test_slices_of_different_heads_may_overlap() -> None:
    mask = AttnMask([[0, 3, 0, 3, 0], [0, 3, 0, 3, 1]], 3, head_ptr=[0, 1, 2])
    assert mask.num_heads == 2
    assert mask.area() == 9 + 6
    assert [mask.head(h).area() for h in range(mask.num_heads)] == [9, 6]
    dense = mask.to_dense()
    assert tuple(dense.shape) == (2, 3, 3)
    assert dense[0].all() and dense[1].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # ... but not within one head.
    with pytest.raises(ValueError, match="overlap"):
        AttnMask([[0, 3, 0, 3, 0], [0, 3, 0, 3, 1], [0, 1, 0, 1, 0]], 3, head_ptr=[0, 2, 3])


@pytest.mark.parametrize(
    "bad",
    [
        [0, 5, 0, 4, 0],  # q_end > seqlen_q
        [0, 4, 0, 5, 0],  # k_end > seqlen_k
        [-1, 2, 0, 2, 0],  # negative start
        [0, 2, -1, 2, 0],
        [2, 2, 0, 2, 0],  # empty q range
        [3, 2, 0, 2, 0],  # reversed
        [0, 2, 1, 1, 0],  # empty k range
        [0, 2, 0, 2, 4],  # unknown kind
        [0, 2, 0, 2, -1],
        [0, 3, 0, 2, 3],  # bi_causal with n < m attends nothing
    ],
)
def test_invalid_slice_rejected(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="slice"):
        AttnMask([bad], 4)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (([[0, 1, 0, 1]], 4), {}),  # not 5 columns
        (([[0, 1, 0, 1, 0]], 0), {}),  # seqlen_q = 0
        (([[0, 1, 0, 1, 0]], 4, 0), {}),  # seqlen_k = 0
        (([[0, 1, 0, 1, 0]], 4), {"head_ptr": [0, 2]}),  # head_ptr beyond the slices
        (([[0, 1, 0, 1, 0]], 4), {"doc_lengths": [1, 2]}),  # documents do not sum to 4
    ],
)
def test_invalid_constructor_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AttnMask(*args, **kwargs)


@FAST
@given(data=st.data())
def test_random_slice_sets_accepted_iff_disjoint(data: st.DataObject) -> None:
    sq, sk = data.draw(shapes(8))
    slices = data.draw(st.lists(any_slice(sq, sk), min_size=1, max_size=6))
    denses = [slice_dense(s, sq, sk) for s in slices]
    if not all(d.any() for d in denses):
        with pytest.raises(ValueError):
            AttnMask(slices, sq, sk)
        return
    overlapping = [
        (a, b)
        for a in range(len(slices))
        for b in range(a + 1, len(slices))
        if (denses[a] & denses[b]).any()
    ]
    if overlapping:
        with pytest.raises(ValueError, match="overlap") as err:
            AttnMask(slices, sq, sk)
        # The message names two slices that really overlap (by index and value).
        named = [int(x) for x in re.findall(r"(?:slices|and) (\d+) \[", str(err.value))]
        assert len(named) == 2 and tuple(sorted(named)) in overlapping, str(err.value)
        for idx in named:
            assert str(slices[idx]) in str(err.value)
        return
    mask = AttnMask(slices, sq, sk)
    union = np.logical_or.reduce(denses)
    assert np.array_equal(mask.to_dense().numpy(), union)
    assert mask.area() == int(union.sum()) == sum(int(d.sum()) for d in denses)


@FAST
@given(case=valid_masks())
def test_disjoint_slice_sets_accepted_with_exact_area(case: tuple[AttnMask, np.ndarray]) -> None:
    mask, dense = case
    assert np.array_equal(as3d(mask), dense)
    assert mask.area() == int(dense.sum())
    assert [mask.head(h).area() for h in range(mask.num_heads)] == dense.sum(axis=(1, 2)).tolist()
    H, sq, sk = dense.shape
    assert mask.density() == pytest.approx(dense.sum() / (H * sq * sk))


# ----------------------------------------------------------------------------- dense forms
@FAST
@given(data=st.data())
def test_from_dense_round_trip(data: st.DataObject) -> None:
    sq, sk = data.draw(shapes(16))
    three_d = data.draw(st.booleans())
    shape = (data.draw(st.integers(1, 3)), sq, sk) if three_d else (sq, sk)
    p = data.draw(st.sampled_from([0.1, 0.5, 0.9]))
    seed = data.draw(st.integers(0, 2**32 - 1))
    arr = np.random.default_rng(seed).random(shape) < p
    mask = AttnMask.from_dense(arr)
    assert mask.area() == int(arr.sum())
    assert mask.num_heads == (shape[0] if three_d else 1)
    out = mask.to_dense().numpy()
    # One head comes back as (Sq, Sk), several as (H, Sq, Sk).
    expected = arr[0] if three_d and shape[0] == 1 else arr
    assert out.shape == expected.shape and np.array_equal(out, expected)
    # Also from a torch tensor.
    from_torch = AttnMask.from_dense(torch.from_numpy(arr)).to_dense().numpy()
    assert np.array_equal(from_torch, expected)


@FAST
@given(case=valid_masks())
def test_row_intervals_are_the_merged_runs_of_each_row(case: tuple[AttnMask, np.ndarray]) -> None:
    mask, dense = case
    ri = mask.row_intervals()
    H, sq, sk = dense.shape
    rows = dense.reshape(H * sq, sk)
    assert len(ri.ptr) == H * sq + 1
    for r, row in enumerate(rows):
        padded = np.concatenate([[False], row, [False]]).astype(np.int8)
        edges = np.diff(padded)
        want = list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))
        got = list(
            zip(
                ri.starts[ri.ptr[r] : ri.ptr[r + 1]],
                ri.ends[ri.ptr[r] : ri.ptr[r + 1]],
                strict=True,
            )
        )
        assert [tuple(map(int, x)) for x in got] == [tuple(map(int, x)) for x in want], r


def test_to_dense_shapes_and_dtype() -> None:
    one = AttnMask([[0, 2, 0, 3, 0]], 2, 3)
    d = one.to_dense()
    assert tuple(d.shape) == (2, 3) and str(d.dtype) == "torch.bool"
    two = AttnMask([[0, 2, 0, 3, 0], [0, 1, 0, 1, 0]], 2, 3, head_ptr=[0, 1, 2])
    d = two.to_dense()
    assert tuple(d.shape) == (2, 2, 3)
    assert d.sum().item() == 6 + 1
    # The limit is inclusive of exactly-fitting masks.
    assert tuple(two.to_dense(max_elements=12).shape) == (2, 2, 3)
    with pytest.raises(ValueError, match="max_elements"):
        two.to_dense(max_elements=11)


# ----------------------------------------------------------------------------- equality
def test_equality_is_by_attended_set() -> None:
    causal = AttnMask([[0, 4, 0, 4, 1]], 4)
    # Same lower triangle from other slices: rows split, and the diagonal as bi_causal pieces.
    split = AttnMask([[0, 2, 0, 2, 1], [2, 4, 0, 2, 0], [2, 4, 2, 4, 1]], 4)
    assert causal == split
    per_row = AttnMask([[i, i + 1, 0, i + 1, 0] for i in range(4)], 4)
    assert causal == per_row
    assert causal != AttnMask([[0, 4, 0, 4, 0]], 4)  # full
    assert causal != AttnMask([[0, 4, 0, 4, 2]], 4)  # upper triangle, same area
    assert causal != AttnMask([[0, 4, 0, 4, 1]], 4, 5)  # other shape
    two_heads = AttnMask([[0, 4, 0, 4, 1], [0, 4, 0, 4, 1]], 4, head_ptr=[0, 1, 2])
    assert causal != two_heads  # other head count
    assert two_heads == AttnMask.from_dense(np.stack([np.tril(np.ones((4, 4), bool))] * 2))
    assert causal != "causal"


@FAST
@given(data=st.data())
def test_equality_matches_dense_equality(data: st.DataObject) -> None:
    sq, sk = data.draw(shapes(8))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    a = rng.random((sq, sk)) < 0.5
    b = a.copy()
    if data.draw(st.booleans()):
        i, j = rng.integers(sq), rng.integers(sk)
        b[i, j] = ~b[i, j]
    assert (AttnMask.from_dense(a) == AttnMask.from_dense(b)) == bool(np.array_equal(a, b))


# ----------------------------------------------------------------------------- restrict / transpose
def check_restrict(
    mask: AttnMask, dense: np.ndarray, q: tuple[int, int], k: tuple[int, int]
) -> None:
    sub = mask.restrict(q, k)
    crop = dense[:, q[0] : q[1], k[0] : k[1]]
    assert sub.shape == (q[1] - q[0], k[1] - k[0])
    assert sub.num_heads == mask.num_heads
    assert np.array_equal(as3d(sub), crop)
    assert sub.area() == int(crop.sum())
    assert [sub.head(h).area() for h in range(sub.num_heads)] == crop.sum(axis=(1, 2)).tolist()
    # The restricted slices are themselves a valid (in-bounds, non-empty, disjoint) mask.
    AttnMask(sub.slices, sub.seqlen_q, sub.seqlen_k, head_ptr=sub.head_ptr)


def check_transpose(mask: AttnMask, dense: np.ndarray) -> None:
    t = mask.transpose()
    assert t.shape == (mask.seqlen_k, mask.seqlen_q)
    assert t.num_heads == mask.num_heads
    assert np.array_equal(as3d(t), dense.transpose(0, 2, 1))
    assert t.area() == mask.area()
    AttnMask(t.slices, t.seqlen_q, t.seqlen_k, head_ptr=t.head_ptr)
    assert t.transpose() == mask


@FAST
@given(data=st.data())
def test_restrict_and_transpose_of_hand_built_masks(data: st.DataObject) -> None:
    mask, dense = data.draw(valid_masks(12))
    q, k = data.draw(rectangles(mask.seqlen_q, mask.seqlen_k))
    check_restrict(mask, dense, q, k)
    # Restricting twice composes like cropping twice.
    sub = mask.restrict(q, k)
    q2, k2 = data.draw(rectangles(*sub.shape))
    check_restrict(sub, dense[:, q[0] : q[1], k[0] : k[1]], q2, k2)
    check_transpose(mask, dense)


@pytest.mark.parametrize("name", list_masks())
@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_restrict_and_transpose_of_patterns(name: str, data: st.DataObject, seed: int) -> None:
    mask = make_pattern(name, data, seed)
    dense = as3d(mask)
    for _ in range(3):
        q, k = data.draw(rectangles(mask.seqlen_q, mask.seqlen_k))
        check_restrict(mask, dense, q, k)
    # The whole rectangle gives back the same mask.
    assert mask.restrict((0, mask.seqlen_q), (0, mask.seqlen_k)) == mask
    check_transpose(mask, dense)


def test_restrict_by_hand() -> None:
    causal = make_mask("causal", 8)
    # Rows 4..7 against keys 0..3: entirely below the diagonal -> full 4x4.
    assert causal.restrict((4, 8), (0, 4)).to_dense().all()
    # Rows 0..3 against keys 4..7: entirely above -> nothing.
    assert causal.restrict((0, 4), (4, 8)).area() == 0
    # Rows 2..5 against keys 3..6 (local): row r sees local cols <= r - 1.
    assert causal.restrict((2, 6), (3, 7)).to_dense().int().tolist() == [
        [0, 0, 0, 0],
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
    ]


@pytest.mark.parametrize(
    ("q", "k"),
    [((0, 0), (0, 4)), ((2, 1), (0, 4)), ((0, 5), (0, 4)), ((-1, 2), (0, 4)), ((0, 4), (3, 9))],
)
def test_restrict_outside_or_empty_rejected(q: tuple[int, int], k: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        make_mask("causal", 4).restrict(q, k)


# ----------------------------------------------------------------------------- metadata
def test_doc_metadata_and_summary() -> None:
    mask = make_mask("causal_document", 10, doc_lengths=[3, 3, 4])
    assert mask.doc_lengths.tolist() == [3, 3, 4]
    assert mask.doc_lengths.dtype == np.int64
    assert mask.doc_boundaries.tolist() == [0, 3, 6, 10]
    assert make_mask("causal", 10).doc_lengths is None
    assert make_mask("causal", 10).doc_boundaries is None
    line = mask.summary()
    assert isinstance(line, str) and "\n" not in line and "causal_document" in line
