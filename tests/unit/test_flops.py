"""FLOP convention: fwd = 4 * area * Hq * D (per-head masks: mean area), bwd 2.5x, fwd_bwd 3.5x."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.flops import attention_flops, dense_flops
from lcab.masks import AttnMask, make_mask


def test_full_mask_by_hand() -> None:
    mask = make_mask("full", 8192)
    # 4 * 8192^2 * 64 * 128 = 2^2 * 2^26 * 2^6 * 2^7 = 2^41
    assert attention_flops(mask, 64, 128) == 2**41 == 2_199_023_255_552
    assert attention_flops(mask, 64, 128, pass_="fwd") == 2_199_023_255_552
    assert attention_flops(mask, 64, 128, pass_="bwd") == 5_497_558_138_880
    assert attention_flops(mask, 64, 128, pass_="fwd_bwd") == 7_696_581_394_432
    assert dense_flops(8192, 8192, 64, 128) == 2_199_023_255_552
    assert dense_flops(8192, 8192, 64, 128, pass_="bwd") == 5_497_558_138_880
    assert dense_flops(8192, 8192, 64, 128, pass_="fwd_bwd") == 7_696_581_394_432


def test_causal_mask_by_hand() -> None:
    mask = make_mask("causal", 8192)
    # area = 8192 * 8193 / 2 = 33,558,528; fwd = 4 * area * 64 * 128 = 8193 * 2^27.
    assert mask.area() == 33_558_528
    fwd = attention_flops(mask, 64, 128)
    assert fwd == 1_099_645_845_504
    assert attention_flops(mask, 64, 128, pass_="bwd") == 2_749_114_613_760
    assert attention_flops(mask, 64, 128, pass_="fwd_bwd") == 3_848_760_459_264
    for pass_ in ("fwd", "bwd", "fwd_bwd"):
        assert isinstance(attention_flops(mask, 64, 128, pass_=pass_), int)


def test_small_odd_area_exact() -> None:
    # causal S=3: area 6; Hq=1, D=1: fwd 24, bwd 60, fwd_bwd 84 (exact integers).
    mask = make_mask("causal", 3)
    assert [attention_flops(mask, 1, 1, pass_=p) for p in ("fwd", "bwd", "fwd_bwd")] == [24, 60, 84]
    # Rectangular hand-built mask: area 1 (a single pair), Hq=3, D=5 -> 60, 150, 210.
    single = AttnMask([[1, 2, 2, 3, 0]], 2, 4)
    assert [attention_flops(single, 3, 5, pass_=p) for p in ("fwd", "bwd", "fwd_bwd")] == [
        60,
        150,
        210,
    ]
    # dense_flops of a rectangle: 4 * 3 * 7 * 2 * 5.
    assert dense_flops(3, 7, 2, 5) == 840


def test_per_head_mask_uses_mean_area() -> None:
    # Head 0: full 4x4 (16 pairs), head 1: causal 4x4 (10 pairs): mean area 13.
    mask = AttnMask([[0, 4, 0, 4, 0], [0, 4, 0, 4, 1]], 4, head_ptr=[0, 1, 2])
    assert mask.area() == 26
    # Hq = 2 (one query head per mask head): 4 * 13 * 2 * 1 = 104.
    assert attention_flops(mask, 2, 1) == 104
    # Hq = 8, D = 64: 4 * 13 * 8 * 64.
    assert attention_flops(mask, 8, 64) == 26_624
    assert attention_flops(mask, 8, 64, pass_="bwd") == 66_560
    assert attention_flops(mask, 8, 64, pass_="fwd_bwd") == 93_184
    with pytest.raises(ValueError, match="heads_q"):
        attention_flops(mask, 3, 64)  # 3 query heads cannot share 2 mask heads


@settings(max_examples=40, deadline=None)
@given(
    heads=st.integers(1, 4),
    group=st.integers(1, 4),
    head_dim=st.integers(1, 256),
    seed=st.integers(0, 2**32 - 1),
)
def test_block_sparse_flops_from_dense_count(
    heads: int, group: int, head_dim: int, seed: int
) -> None:
    mask = make_mask("block_sparse", 96, seed=seed, block_size=16, density=0.5, heads=heads)
    attended = int(mask.to_dense().numpy().sum())  # over all mask heads
    hq = heads * group
    # Each of the hq query heads uses its group's mask: total = 4 * D * group * sum_h area_h.
    fwd = 4 * attended * group * head_dim
    assert attention_flops(mask, hq, head_dim) == fwd
    assert 2 * attention_flops(mask, hq, head_dim, pass_="bwd") == 5 * fwd
    assert 2 * attention_flops(mask, hq, head_dim, pass_="fwd_bwd") == 7 * fwd


@settings(max_examples=40, deadline=None)
@given(seqlen=st.integers(1, 200), hq=st.integers(1, 64), head_dim=st.integers(1, 256))
def test_static_mask_flops_formula(seqlen: int, hq: int, head_dim: int) -> None:
    i = np.arange(seqlen)
    area = int((i[None, :] <= i[:, None]).sum())
    assert area == seqlen * (seqlen + 1) // 2
    mask = make_mask("causal", seqlen)
    fwd = 4 * area * hq * head_dim
    assert attention_flops(mask, hq, head_dim) == fwd
    assert attention_flops(mask, hq, head_dim, pass_="bwd") * 2 == 5 * fwd
    assert attention_flops(mask, hq, head_dim, pass_="fwd_bwd") * 2 == 7 * fwd
    assert dense_flops(seqlen, seqlen, hq, head_dim) == 4 * seqlen * seqlen * hq * head_dim


@pytest.mark.parametrize("pass_", ["forward", "bwd_fwd", "", "FWD"])
def test_bad_pass_name(pass_: str) -> None:
    with pytest.raises(ValueError, match="pass"):
        attention_flops(make_mask("causal", 8), 1, 1, pass_=pass_)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pass"):
        dense_flops(8, 8, 1, 1, pass_=pass_)  # type: ignore[arg-type]


@pytest.mark.parametrize(("hq", "d"), [(0, 64), (-1, 64), (8, 0), (8, -4)])
def test_bad_heads_or_dim(hq: int, d: int) -> None:
    with pytest.raises(ValueError):
        attention_flops(make_mask("causal", 8), hq, d)
    with pytest.raises(ValueError):
        dense_flops(8, 8, hq, d)


def test_heads_not_multiple_of_mask_heads() -> None:
    mask = make_mask("block_sparse", 64, block_size=16, heads=4)
    for hq in (1, 2, 3, 6, 10):
        with pytest.raises(ValueError, match="heads_q"):
            attention_flops(mask, hq, 64)
    assert attention_flops(mask, 4, 64) > 0
