"""The fast lowerings return bit-for-bit what the pre-speed-up versions returned.

`tests/helpers/lowering_reference.py` keeps the earlier implementations verbatim; every array of
the new results must be equal to theirs with the same dtype and shape, over every registered
pattern (whole and restricted to a random rectangle), random slices of every kind, arbitrary
dense masks, uniform and explicit block offsets, and 1M-token masks.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import (
    BlockTable,
    NotExpressible,
    block_table,
    flex_block_mask,
    flex_mask_mod,
    to_flashmask,
    to_varlen,
)
from lcab.masks.lowering import flex as flex_module
from lcab.masks.lowering.rows import row_intervals
from tests.helpers.lowering_reference import (
    block_table_reference,
    flex_block_mask_reference,
    flex_mask_mod_reference,
    to_flashmask_reference,
    to_varlen_reference,
)
from tests.helpers.masks import (
    ALL_PATTERNS,
    any_masks,
    fast,
    from_dense,
    pattern_masks,
    restricted,
)

BLOCK_MASK_TENSORS = (
    "kv_num_blocks",
    "kv_indices",
    "full_kv_num_blocks",
    "full_kv_indices",
    "q_num_blocks",
    "q_indices",
    "full_q_num_blocks",
    "full_q_indices",
)


def assert_same_table(new: BlockTable, ref: BlockTable) -> None:
    """Every field equal, arrays with the same dtype and shape."""
    for f in fields(BlockTable):
        a, b = getattr(new, f.name), getattr(ref, f.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f.name
            assert np.array_equal(a, b), f.name
        else:
            assert a == b, f.name


def assert_same_block_mask(mask: AttnMask, heads_q: int | None, block: int) -> None:
    """The BlockMask tensors, sizes and mask_mod outputs equal the reference's."""
    new = flex_block_mask(mask, heads_q=heads_q, block_size=block)
    ref = flex_block_mask_reference(mask, heads_q=heads_q, block_size=block)
    for name in BLOCK_MASK_TENSORS:
        a, b = getattr(new, name), getattr(ref, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
    assert new.seq_lengths == ref.seq_lengths and new.BLOCK_SIZE == ref.BLOCK_SIZE
    h = max(heads_q or 1, 1)
    q = torch.arange(mask.seqlen_q)[:, None]
    k = torch.arange(mask.seqlen_k)[None, :]
    for head in range(h):
        hh = torch.tensor(head)
        assert torch.equal(new.mask_mod(0, hh, q, k), ref.mask_mod(0, hh, q, k))


def heads_for(mask: AttnMask, factor: int) -> int | None:
    """heads_q for a per-head mask (a multiple of its heads), None for a head-shared one."""
    return None if mask.num_heads == 1 else mask.num_heads * factor


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data(), block=st.integers(1, 48))
def test_block_table_equals_reference_patterns(name: str, data: st.DataObject, block: int) -> None:
    mask = data.draw(st.one_of(pattern_masks(name), restricted(name)))
    assert_same_table(block_table(mask, block), block_table_reference(mask, block))


@fast(120)
@given(mask=any_masks(), q_block=st.integers(1, 40), k_block=st.integers(1, 40))
def test_block_table_equals_reference_any_mask(mask: AttnMask, q_block: int, k_block: int) -> None:
    assert_same_table(
        block_table(mask, q_block, k_block), block_table_reference(mask, q_block, k_block)
    )


@fast(60)
@given(mask=any_masks(), data=st.data())
def test_block_table_equals_reference_explicit_offsets(mask: AttnMask, data: st.DataObject) -> None:
    def offsets(n: int) -> np.ndarray:
        cuts = data.draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=8))
        return np.array(sorted({0, n} | {c for c in cuts if 0 < c < n}), dtype=np.int64)

    qb, kb = offsets(mask.seqlen_q), offsets(mask.seqlen_k)
    assert_same_table(block_table(mask, qb, kb), block_table_reference(mask, qb, kb))


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(8)
@given(data=st.data(), block=st.sampled_from([1, 8, 16, 33]), factor=st.integers(1, 2))
def test_flex_block_mask_equals_reference_patterns(
    name: str, data: st.DataObject, block: int, factor: int
) -> None:
    mask = data.draw(st.one_of(pattern_masks(name), restricted(name)))
    assert_same_block_mask(mask, heads_for(mask, factor), block)


@fast(60)
@given(mask=any_masks(), block=st.integers(1, 40), factor=st.integers(1, 3))
def test_flex_block_mask_equals_reference_any_mask(mask: AttnMask, block: int, factor: int) -> None:
    assert_same_block_mask(mask, heads_for(mask, factor), block)


@pytest.mark.parametrize("name", ["causal_document", "sliding_window"])
def test_block_table_equals_reference_at_1m_tokens(name: str) -> None:
    mask = make_mask(name, 1 << 20, seed=0)
    assert_same_table(block_table(mask, 128), block_table_reference(mask, 128))


@fast(30)
@given(mask=any_masks(), block=st.integers(1, 40), factor=st.integers(1, 3))
def test_flex_block_mask_from_given_table_equals_reference(
    mask: AttnMask, block: int, factor: int
) -> None:
    heads_q = heads_for(mask, factor)
    new = flex_block_mask(mask, heads_q=heads_q, block_size=block, table=block_table(mask, block))
    ref = flex_block_mask_reference(mask, heads_q=heads_q, block_size=block)
    for name in BLOCK_MASK_TENSORS:
        assert torch.equal(getattr(new, name), getattr(ref, name)), name


def assert_same_arrays(new: object, ref: object) -> None:
    """Dataclass results: every array field equal with the same dtype and shape."""
    assert type(new) is type(ref)
    for f in fields(new):  # type: ignore[arg-type]
        a, b = getattr(new, f.name), getattr(ref, f.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f.name
            assert np.array_equal(a, b), f.name
        elif isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), f.name
        else:
            assert a == b, f.name


def assert_same_lowering(new_fn, ref_fn, mask: AttnMask) -> None:  # type: ignore[no-untyped-def]
    """Same result, or the same NotExpressible message."""
    try:
        ref = ref_fn(mask)
    except NotExpressible as err:
        with pytest.raises(NotExpressible) as got:
            new_fn(mask)
        assert str(got.value) == str(err)
        return
    assert_same_arrays(new_fn(mask), ref)


@fast(150)
@given(mask=any_masks())
def test_row_intervals_equal_core(mask: AttnMask) -> None:
    for m in (mask, mask.transpose()):
        assert_same_arrays(row_intervals(m), m.row_intervals())


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_varlen_flashmask_flex_mod_equal_reference_patterns(name: str, data: st.DataObject) -> None:
    mask = data.draw(st.one_of(pattern_masks(name), restricted(name)))
    assert_same_lowering(to_varlen, to_varlen_reference, mask)
    assert_same_lowering(to_flashmask, to_flashmask_reference, mask)
    heads_q = heads_for(mask, 2)
    assert_same_arrays(flex_mask_mod(mask, heads_q), flex_mask_mod_reference(mask, heads_q))


@fast(100)
@given(mask=any_masks())
def test_varlen_flashmask_flex_mod_equal_reference_any_mask(mask: AttnMask) -> None:
    assert_same_lowering(to_varlen, to_varlen_reference, mask)
    assert_same_lowering(to_flashmask, to_flashmask_reference, mask)
    heads_q = heads_for(mask, 1)
    assert_same_arrays(flex_mask_mod(mask, heads_q), flex_mask_mod_reference(mask, heads_q))


@pytest.mark.parametrize("name", ["causal_document", "sliding_window"])
def test_varlen_flashmask_equal_reference_at_1m_tokens(name: str) -> None:
    mask = make_mask(name, 1 << 20, seed=0)
    assert_same_lowering(to_varlen, to_varlen_reference, mask)
    assert_same_lowering(to_flashmask, to_flashmask_reference, mask)


def test_varlen_window_mismatch_message_equals_reference() -> None:
    dense = np.zeros((8, 8), dtype=bool)
    dense[:4, :4] = np.tril(np.ones((4, 4), dtype=bool))  # a causal document...
    dense[4:, 4:] = True  # ...next to a bidirectional one: no common window
    mask = from_dense(dense)
    with pytest.raises(NotExpressible, match="no single"):
        to_varlen_reference(mask)
    assert_same_lowering(to_varlen, to_varlen_reference, mask)


@fast(40)
@given(mask=any_masks(), block=st.integers(1, 20), factor=st.integers(1, 2))
def test_flex_block_mask_run_by_run_writes_equal_reference(
    mask: AttnMask, block: int, factor: int
) -> None:
    # Small masks have short runs; force the long-run path so it is checked too.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flex_module, "LONG_RUN", 1)
        assert_same_block_mask(mask, heads_for(mask, factor), block)


def test_flex_block_mask_equals_reference_at_1m_tokens() -> None:
    mask = make_mask("causal_document", 1 << 20, seed=0)
    new, ref = flex_block_mask(mask), flex_block_mask_reference(mask)
    for name in BLOCK_MASK_TENSORS:
        a, b = getattr(new, name), getattr(ref, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
