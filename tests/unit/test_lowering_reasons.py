"""`lowering_reason`: None exactly when the named lowering succeeds, else a readable reason."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import (
    LOWERING_REASONS,
    NotExpressible,
    block_table,
    flex_block_mask,
    lowering_reason,
    to_ffa,
    to_flashmask,
    to_varlen,
)
from tests.helpers.masks import any_masks, dense3, fast

EXPECTED_NAMES = {"dense", "ranges", "flex", "block_table", "varlen", "flashmask", "ffa"}


def attempt(mask: AttnMask, name: str) -> bool:
    """Run the lowering ``name`` itself; True if it succeeds, False if NotExpressible."""
    try:
        if name == "dense":
            assert dense3(mask).shape[1:] == mask.shape
        elif name == "ranges":
            assert mask.slices.shape[1] == 5
        elif name == "flex":
            flex_block_mask(mask, heads_q=2 * mask.num_heads, block_size=32)
        elif name == "block_table":
            block_table(mask, 16)
        elif name == "varlen":
            to_varlen(mask)
        elif name == "flashmask":
            to_flashmask(mask)
        elif name == "ffa":
            to_ffa(mask)
        else:
            raise AssertionError(f"no test mapping for lowering {name!r}")
    except NotExpressible:
        return False
    return True


def test_lowering_names() -> None:
    assert set(LOWERING_REASONS) == EXPECTED_NAMES


@fast(60)
@given(mask=any_masks(max_heads=3), name=st.sampled_from(sorted(EXPECTED_NAMES)))
def test_reason_none_iff_lowering_succeeds(mask: AttnMask, name: str) -> None:
    reason = lowering_reason(mask, name)
    ok = attempt(mask, name)
    assert (reason is None) == ok, f"{name}: reason={reason!r} but lowering succeeded={ok}"
    if reason is not None:
        assert isinstance(reason, str) and reason.strip()


@pytest.mark.parametrize("name", ["dense", "ranges", "flex", "block_table"])
def test_always_expressible_lowerings(name: str) -> None:
    for mask in (
        make_mask("share_question", 60, doc_lengths=[10, 20, 30]),
        make_mask("block_sparse", 64, block_size=8, heads=3),
        AttnMask.from_dense(np.random.default_rng(0).random((2, 30, 40)) < 0.3),
    ):
        assert lowering_reason(mask, name) is None


@pytest.mark.parametrize("name", ["varlen", "flashmask", "ffa"])
def test_per_head_mask_reasons(name: str) -> None:
    mask = make_mask("block_sparse", 64, block_size=16, heads=2)
    if name == "flashmask":  # FlashMask takes per-head column indices: only shape can fail
        assert (lowering_reason(mask, name) is None) == attempt(mask, name)
    else:
        assert lowering_reason(mask, name)


@pytest.mark.parametrize("bad", ["Dense", "", "flash", "sdpa", "flexattention"])
def test_unknown_lowering_name(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        lowering_reason(make_mask("causal", 8), bad)
    message = str(info.value)
    assert all(name in message for name in EXPECTED_NAMES), message
