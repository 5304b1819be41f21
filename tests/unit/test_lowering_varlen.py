"""FlashAttention varlen lowering against an emulator of FlashAttention's documented semantics.

Emulator (from the FlashAttention docs, not from lcab): sequence b has the query rows
``cu_q[b]:cu_q[b+1]`` (sq of them) and the key columns ``cu_k[b]:cu_k[b+1]`` (sk); its local
query i attends local key j iff ``i + sk - sq - left <= j <= i + sk - sq + right`` and
``0 <= j < sk``, where left = -1 (right = -1) removes the lower (upper) limit and ``causal=True``
means right = 0 (bottom-right aligned). Queries never see keys of another sequence.

Whenever `to_varlen` returns, the emulated mask must equal ``mask.to_dense()``. Completeness:
every mask *generated* by the emulator from random arguments is expressible, so `to_varlen`
must accept it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import NotExpressible, VarlenArgs, lowering_reason, to_varlen
from tests.helpers.masks import (
    ALL_PATTERNS,
    dense3,
    dense_masks,
    fast,
    pattern_masks,
    rectangles,
    restricted,
    slice_masks,
)

#: Patterns the task states are always expressible for varlen kernels (single head).
EXPRESSIBLE = frozenset(
    {
        "full",
        "causal",
        "full_document",
        "causal_document",
        "sliding_window",
        "sliding_window_causal",
    }
)


# ----------------------------------------------------------------------------- emulator
def varlen_dense(
    cu_q, cu_k, causal: bool, window: tuple[int, int], sq_total: int, sk_total: int
) -> np.ndarray:
    """The (Sq, Sk) mask FlashAttention applies for these varlen arguments."""
    left, right = window
    if causal:
        right = 0
    out = np.zeros((sq_total, sk_total), dtype=bool)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        sq, sk = q1 - q0, k1 - k0
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        diag = i + sk - sq
        ok = np.ones((sq, sk), dtype=bool)
        if left != -1:
            ok &= j >= diag - left
        if right != -1:
            ok &= j <= diag + right
        out[q0:q1, k0:k1] = ok
    return out


def check_args_shape(args: VarlenArgs, sq: int, sk: int) -> None:
    cu_q = np.asarray(args.cu_seqlens_q)
    cu_k = np.asarray(args.cu_seqlens_k)
    assert np.issubdtype(cu_q.dtype, np.integer) and np.issubdtype(cu_k.dtype, np.integer)
    assert cu_q.ndim == cu_k.ndim == 1 and len(cu_q) == len(cu_k) >= 2
    assert cu_q[0] == 0 and cu_k[0] == 0
    assert cu_q[-1] == sq and cu_k[-1] == sk
    assert (np.diff(cu_q) >= 0).all() and (np.diff(cu_k) >= 0).all()
    assert args.max_seqlen_q == int(np.diff(cu_q).max())
    assert args.max_seqlen_k == int(np.diff(cu_k).max())
    assert isinstance(args.causal, (bool, np.bool_))
    left, right = args.window_size
    assert int(left) == left >= -1 and int(right) == right >= -1
    assert args.is_single_sequence == (len(cu_q) == 2)


def check_varlen(mask: AttnMask, *, must_succeed: bool = False) -> VarlenArgs | None:
    """If to_varlen returns, its emulation equals the dense mask; reasons agree with it."""
    try:
        args = to_varlen(mask)
    except NotExpressible as err:
        assert not must_succeed, f"{mask!r} should be expressible, got: {err}"
        assert str(err)
        assert isinstance(err, ValueError)
        assert lowering_reason(mask, "varlen") == str(err)
        return None
    assert lowering_reason(mask, "varlen") is None
    dense = dense3(mask)
    assert dense.shape[0] == 1
    check_args_shape(args, mask.seqlen_q, mask.seqlen_k)
    got = varlen_dense(
        args.cu_seqlens_q, args.cu_seqlens_k, bool(args.causal), args.window_size, *mask.shape
    )
    if not np.array_equal(got, dense[0]):
        bad = tuple(np.argwhere(got != dense[0])[0].tolist())
        raise AssertionError(
            f"{mask!r}: varlen args {args} give {got[bad]} at (q, k) = {bad}, mask has "
            f"{dense[0][bad]}"
        )
    return args


# ----------------------------------------------------------------------------- patterns
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(30)
@given(data=st.data())
def test_varlen_patterns(name: str, data: st.DataObject) -> None:
    mask = data.draw(pattern_masks(name))
    check_varlen(mask, must_succeed=name in EXPRESSIBLE)


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(20)
@given(data=st.data())
def test_varlen_restricted(name: str, data: st.DataObject) -> None:
    check_varlen(data.draw(restricted(name)))


@pytest.mark.parametrize("name", sorted(EXPRESSIBLE))
@fast(20)
@given(data=st.data())
def test_varlen_diagonal_blocks_expressible(name: str, data: st.DataObject) -> None:
    """A square diagonal block of an expressible mask is again such a mask: expressible."""
    mask = data.draw(pattern_masks(name))
    (q0, q1), _ = data.draw(rectangles(mask.seqlen_q, mask.seqlen_k))
    check_varlen(mask.restrict((q0, q1), (q0, q1)), must_succeed=True)


@pytest.mark.parametrize("name", ["full", "causal", "causal_document", "full_document"])
@fast(20)
@given(data=st.data())
def test_varlen_cp_steps_expressible(name: str, data: st.DataObject) -> None:
    """Context-parallel steps of causal/document masks: a query chunk against a key chunk."""
    mask = data.draw(pattern_masks(name))
    S = mask.seqlen_q
    assume(S >= 2)
    n = data.draw(st.integers(2, min(S, 8)))
    bounds = np.linspace(0, S, n + 1).astype(int)
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(0, a))  # key chunk at or before the query chunk
    sub = mask.restrict((bounds[a], bounds[a + 1]), (bounds[b], bounds[b + 1]))
    check_varlen(sub, must_succeed=True)


# ----------------------------------------------------------------------------- random masks
@fast(150)
@given(mask=st.one_of(dense_masks(max_len=60), slice_masks(max_len=80)))
def test_varlen_random_masks_exact_when_accepted(mask: AttnMask) -> None:
    check_varlen(mask)


@st.composite
def varlen_generated(draw: st.DrawFn) -> tuple[np.ndarray, tuple]:
    """A mask generated by the emulator from random varlen arguments, and those arguments."""
    n = draw(st.integers(1, 5))
    lens_q = draw(st.lists(st.integers(0, 25), min_size=n, max_size=n))
    lens_k = draw(st.lists(st.integers(0, 25), min_size=n, max_size=n))
    assume(sum(lens_q) >= 1 and sum(lens_k) >= 1)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_k = np.concatenate([[0], np.cumsum(lens_k)])
    causal = draw(st.booleans())
    left = draw(st.just(-1) | st.integers(0, 30))
    right = draw(st.just(-1) | st.integers(0, 30))
    args = (cu_q, cu_k, causal, (left, right))
    return varlen_dense(*args, int(cu_q[-1]), int(cu_k[-1])), args


@fast(150)
@given(case=varlen_generated())
def test_varlen_generated_masks_expressible(case) -> None:
    dense, _gen_args = case
    check_varlen(AttnMask.from_dense(dense), must_succeed=True)


# ----------------------------------------------------------------------------- not expressible
@fast(25)
@given(data=st.data())
def test_varlen_share_question_not_expressible(data: st.DataObject) -> None:
    """Three or more documents: rows of document >= 2 attend the question and their own doc."""
    docs = data.draw(st.lists(st.integers(1, 30), min_size=3, max_size=6))
    mask = make_mask("share_question", sum(docs), doc_lengths=docs)
    with pytest.raises(NotExpressible):
        to_varlen(mask)
    assert lowering_reason(mask, "varlen")


@fast(25)
@given(S=st.integers(3, 200), data=st.data())
def test_varlen_prefix_lm_not_expressible(S: int, data: st.DataObject) -> None:
    """Prefix rows reach p - 1 keys past their diagonal, later rows none: no common window."""
    prefix = data.draw(st.integers(2, S - 1))
    mask = make_mask("prefix_lm_causal", S, prefix=prefix)
    with pytest.raises(NotExpressible):
        to_varlen(mask)


@pytest.mark.parametrize("prefix", [0, 1, "S"])
def test_varlen_prefix_lm_degenerate_is_expressible(prefix) -> None:
    """prefix 0 or 1 is the causal mask and prefix S the full mask."""
    S = 50
    mask = make_mask("prefix_lm_causal", S, prefix=S if prefix == "S" else prefix)
    args = check_varlen(mask, must_succeed=True)
    assert args is not None and bool(args.causal) == (prefix != "S")


@fast(25)
@given(S=st.integers(4, 200), data=st.data())
def test_varlen_global_sliding_window_not_expressible(S: int, data: st.DataObject) -> None:
    """Some row r >= g has r - w > g: it attends [0, g) and a separate window."""
    g = data.draw(st.integers(1, S - 3))
    w = data.draw(st.integers(0, S - 3 - g))
    mask = make_mask("global_sliding_window", S, window=w, global_tokens=g)
    with pytest.raises(NotExpressible):
        to_varlen(mask)


@pytest.mark.parametrize("name", ["block_sparse", "varblock_sparse"])
@pytest.mark.parametrize("heads", [2, 3])
def test_varlen_per_head_masks_not_expressible(name: str, heads: int) -> None:
    params = {
        "block_sparse": {"block_size": 16},
        "varblock_sparse": {"avg_block_size": 16, "min_block_size": 8},
    }[name]
    mask = make_mask(name, 64, heads=heads, density=1.0, **params)  # every head full
    with pytest.raises(NotExpressible):
        to_varlen(mask)
    assert lowering_reason(mask, "varlen")


@pytest.mark.parametrize(
    "dense",
    [
        # rows 0 and 2 attend key 0, row 1 attends key 1: one FA sequence would need rows 0..2
        # and keys 0..1, and no window gives row 1 key 1 but rows 0, 2 key 0 only.
        [[1, 0], [0, 1], [1, 0]],
        # the block_sparse mask make_mask("block_sparse", 10, seed=0, block_size=3,
        # density=0.01): rows 0-2 and 9 attend keys 0-2, rows 3-8 attend keys 3-5.
        "block_sparse",
    ],
)
def test_varlen_interleaved_query_spans_not_expressible(dense) -> None:
    if dense == "block_sparse":
        mask = make_mask("block_sparse", 10, seed=0, block_size=3, density=0.01)
    else:
        mask = AttnMask.from_dense(np.array(dense, dtype=bool))
    with pytest.raises(NotExpressible):
        to_varlen(mask)
    assert lowering_reason(mask, "varlen")


def test_varlen_identical_heads_still_per_head() -> None:
    """A 3-D mask (per head) is rejected even when every head is the causal mask."""
    causal = np.tril(np.ones((20, 20), dtype=bool))
    with pytest.raises(NotExpressible):
        to_varlen(AttnMask.from_dense(np.stack([causal, causal])))


# ----------------------------------------------------------------------------- examples
@fast(20)
@given(docs=st.lists(st.integers(1, 40), min_size=1, max_size=8), causal=st.booleans())
def test_varlen_documents_use_document_boundaries(docs: list[int], causal: bool) -> None:
    """full/causal_document lower to one sequence per document (the canonical FA usage)."""
    name = "causal_document" if causal else "full_document"
    mask = make_mask(name, sum(docs), doc_lengths=docs)
    args = check_varlen(mask, must_succeed=True)
    assert args is not None
    cu = np.concatenate([[0], np.cumsum(docs)])
    assert np.array_equal(args.cu_seqlens_q, cu) and np.array_equal(args.cu_seqlens_k, cu)
    assert args.max_seqlen_q == args.max_seqlen_k == max(docs)
    if causal and max(docs) > 1:
        assert args.causal


def test_varlen_examples() -> None:
    args = check_varlen(make_mask("causal", 10), must_succeed=True)
    assert args.causal and args.is_single_sequence and args.window_size[0] == -1
    args = check_varlen(make_mask("full", 10), must_succeed=True)
    assert not args.causal and args.window_size == (-1, -1)
    args = check_varlen(make_mask("sliding_window_causal", 50, window=4), must_succeed=True)
    assert args.causal and args.window_size[0] == 4
    args = check_varlen(make_mask("sliding_window", 50, window=4), must_succeed=True)
    assert not args.causal and args.window_size == (4, 4)


def test_varlen_rows_and_keys_attending_nothing() -> None:
    """Empty rows and unattended keys become sequences with zero keys / zero queries."""
    dense = np.zeros((12, 9), dtype=bool)
    dense[3:7, 2:6] = True
    args = check_varlen(AttnMask.from_dense(dense), must_succeed=True)
    assert args is not None
    args = check_varlen(AttnMask.from_dense(np.zeros((5, 7), dtype=bool)), must_succeed=True)
    assert args is not None
