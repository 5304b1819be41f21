"""MagiAttention FFA lowering against an emulator of FFA's documented slice semantics.

Emulator (from the MagiAttention docs, not from lcab): slice n covers the rectangle
``q_ranges[n] x k_ranges[n]``; with m = q_end - q_start, n_k = k_end - k_start and local (i, j),
attn_type_map 0 is full, 1 causal bottom-right (j <= i + n_k - m), 2 inv-causal top-left
(j >= i), 3 bi-causal (both). The mask is the union of the slices; slices must not share a pair
(FFA would count it twice), so the emulated slice areas must add up to the union.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import FFAArgs, NotExpressible, lowering_reason, to_ffa
from tests.helpers.masks import (
    ALL_PATTERNS,
    dense3,
    dense_masks,
    fast,
    kind_tile,
    pattern_masks,
    restricted,
    slice_masks,
)


# ----------------------------------------------------------------------------- emulator
def ffa_dense(args: FFAArgs, sq: int, sk: int) -> tuple[np.ndarray, int]:
    """(union of the slices as (Sq, Sk) bool, sum of the slices' own areas)."""
    out = np.zeros((sq, sk), dtype=bool)
    total = 0
    for (q0, q1), (k0, k1), kind in zip(
        args.q_ranges.tolist(), args.k_ranges.tolist(), args.attn_type_map.tolist(), strict=True
    ):
        assert 0 <= q0 < q1 <= sq and 0 <= k0 < k1 <= sk, f"bad ranges {(q0, q1)} {(k0, k1)}"
        assert kind in (0, 1, 2, 3)
        tile = kind_tile(q1 - q0, k1 - k0, kind)
        total += int(tile.sum())
        out[q0:q1, k0:k1] |= tile
    return out, total


def check_ffa(mask: AttnMask) -> FFAArgs | None:
    if mask.num_heads != 1:
        with pytest.raises(NotExpressible):
            to_ffa(mask)
        assert lowering_reason(mask, "ffa")
        return None
    args = to_ffa(mask)
    assert lowering_reason(mask, "ffa") is None
    n = len(args.attn_type_map)
    assert args.q_ranges.shape == (n, 2) and args.k_ranges.shape == (n, 2)
    assert args.attn_type_map.shape == (n,)
    for a in (args.q_ranges, args.k_ranges, args.attn_type_map):
        assert isinstance(a, np.ndarray) and a.dtype == np.int32
    got, total = ffa_dense(args, *mask.shape)
    want = dense3(mask)[0]
    assert np.array_equal(got, want), f"{mask!r}: FFA union differs from the dense mask"
    assert total == int(want.sum()), "FFA slices overlap (a pair would be counted twice)"
    return args


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(25)
@given(data=st.data())
def test_ffa_patterns(name: str, data: st.DataObject) -> None:
    check_ffa(data.draw(pattern_masks(name)))


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(20)
@given(data=st.data())
def test_ffa_restricted(name: str, data: st.DataObject) -> None:
    check_ffa(data.draw(restricted(name)))


@fast(100)
@given(mask=slice_masks(max_len=100, max_heads=2))
def test_ffa_random_slices_every_kind(mask: AttnMask) -> None:
    check_ffa(mask)


@fast(60)
@given(mask=dense_masks(max_len=60, max_heads=2))
def test_ffa_random_dense(mask: AttnMask) -> None:
    check_ffa(mask)


@pytest.mark.parametrize(
    ("kind", "shape"),
    [
        (kind, shape)
        for kind in (0, 1, 2, 3)
        for shape in ((5, 5), (3, 8), (8, 3), (1, 4), (4, 1))
        if kind_tile(*shape, kind).any()  # a bi_causal slice needs n >= m
    ],
)
def test_ffa_single_slice_kinds(kind: int, shape: tuple[int, int]) -> None:
    """One slice of each kind, square, wide and tall, at an offset inside a larger mask."""
    m, n = shape
    mask = AttnMask([[2, 2 + m, 1, 1 + n, kind]], 2 + m + 3, 1 + n + 2)
    args = check_ffa(mask)
    assert args is not None and args.attn_type_map.tolist() == [kind]
    assert args.q_ranges.tolist() == [[2, 2 + m]] and args.k_ranges.tolist() == [[1, 1 + n]]


def test_ffa_kind_tiles_by_hand() -> None:
    """The emulator's kinds on a 2 x 4 slice (bottom-right causal, top-left inv-causal)."""
    assert kind_tile(2, 4, 1).astype(int).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert kind_tile(2, 4, 2).astype(int).tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert kind_tile(2, 4, 3).astype(int).tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    mask = AttnMask([[0, 2, 0, 4, 3]], 2, 4)
    assert dense3(mask)[0].astype(int).tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]


@pytest.mark.parametrize("heads", [2, 3])
def test_ffa_per_head_not_expressible(heads: int) -> None:
    mask = make_mask("block_sparse", 64, block_size=16, density=0.5, heads=heads)
    with pytest.raises(NotExpressible, match="head"):
        to_ffa(mask)
