"""sparse_flex: FlexAttention on full tiles only, run for real on CPU against the fp64 reference.

* the BlockMask built from lcab's block table selects exactly the mask's positions: expanded
  from ``BlockMask.to_dense()`` (tiles) to positions and cropped to (Sq, Sk), it equals
  ``AttnMask.to_dense()`` per query head, with no partial blocks and no mask_mod in the compiled
  path, for every mask the kernel claims;
* a mask is claimed exactly when each of its tiles on the kernel's grid is all attended or all
  empty (checked on the dense mask, independently of lcab's block table), else refused;
* numerics: eager FlexAttention (``compile=False``) against lcab's fp64 reference — out and LSE,
  GQA, per-head masks, empty rows, Sq != Sk; and once (slow) the compiled CPU path, which
  returns no LSE.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.kernels import Problem, get_kernel
from lcab.masks import AttnMask, make_mask
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),  # Flex's eager-path warning
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # torch's own, importing dynamo
]


def whole_tiles(dense: np.ndarray, block: int) -> bool:
    """Whether every block x block tile (edge tiles cropped) is all attended or all empty."""
    _, sq, sk = dense.shape
    for q0 in range(0, sq, block):
        for k0 in range(0, sk, block):
            tile = dense[:, q0 : q0 + block, k0 : k0 + block]
            if not (tile.all(axis=(1, 2)) | ~tile.any(axis=(1, 2))).all():
                return False
    return True


def per_query_head(mask: AttnMask, heads_q: int) -> np.ndarray:
    """(Hq, Sq, Sk): the mask each query head must see (head h reads mask head h // group)."""
    dense = dense3(mask)
    return dense.repeat(heads_q // dense.shape[0], 0)


def block_mask_positions(block_mask, heads_q: int, shape: tuple[int, int], block: int):
    """(Hq, Sq, Sk) bool: the positions a BlockMask's tiles cover, broadcast over heads."""
    tiles = block_mask.to_dense()[0].bool()  # (H, nq, nk)
    dense = tiles.repeat_interleave(block, 1).repeat_interleave(block, 2)
    return dense[:, : shape[0], : shape[1]].expand(heads_q, -1, -1).numpy()


def tensors(mask: AttnMask, hq: int, hkv: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(mask.seqlen_q, hq, 16, generator=gen, dtype=dtype)
    k = torch.randn(mask.seqlen_k, hkv, 16, generator=gen, dtype=dtype)
    v = torch.randn(mask.seqlen_k, hkv, 16, generator=gen, dtype=dtype)
    return q, k, v


def assert_matches_reference(kernel, mask: AttnMask, hq: int, hkv: int) -> None:
    q, k, v = tensors(mask, hq, hkv)
    out, lse = kernel(q, k, v, mask)
    ref_out, ref_lse = get_kernel("reference")(q, k, v, mask)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert lse is not None and lse.dtype == torch.float64 and lse.shape == (hq, mask.seqlen_q)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- BlockMask
@st.composite
def block_sparse_on_grid(draw: st.DrawFn) -> tuple[AttnMask, int, int]:
    """(block_sparse mask drawn on the kernel's grid, block, query heads), maybe a CP piece."""
    block = draw(st.sampled_from([16, 32, 64]))
    heads_kv = draw(st.integers(1, 2))
    mask = make_mask(
        "block_sparse",
        draw(st.integers(1, 260)),
        block_size=block,
        density=draw(st.integers(1, 100)) / 100,
        heads=heads_kv,
        seed=draw(st.integers(0, 2**16)),
    )
    if draw(st.booleans()):  # a rectangle starting on the grid keeps every tile whole
        q0 = block * draw(st.integers(0, (mask.seqlen_q - 1) // block))
        k0 = block * draw(st.integers(0, (mask.seqlen_k - 1) // block))
        q1 = draw(st.integers(q0 + 1, mask.seqlen_q))
        k1 = draw(st.integers(k0 + 1, mask.seqlen_k))
        mask = mask.restrict((q0, q1), (k0, k1))
    return mask, block, heads_kv * draw(st.integers(1, 2))


@pytest.mark.parametrize("compile_", [True, False], ids=["compiled", "eager"])
@fast(40)
@given(case=block_sparse_on_grid())
def test_block_mask_selects_exactly_the_masks_positions(compile_, case) -> None:
    mask, block, heads_q = case
    heads_kv = max(mask.num_heads, 1)
    kernel = get_kernel("sparse_flex", compile=compile_, block_size=block)
    problem = Problem(*mask.shape, heads_q, heads_kv, 16)
    assert kernel.not_supported_reasons(problem, mask) == []
    block_mask = kernel.prepare(mask, problem).block_mask  # type: ignore[attr-defined]
    got = block_mask_positions(block_mask, heads_q, mask.shape, block)
    assert np.array_equal(got, per_query_head(mask, heads_q))
    assert int(block_mask.kv_num_blocks.sum()) == 0, "every selected tile is a full block"
    assert block_mask.seq_lengths == mask.shape
    if compile_:  # a pure block-sparse kernel: Flex's default no-op mask_mod
        from torch.nn.attention.flex_attention import noop_mask

        assert block_mask.mask_mod is noop_mask


@fast(15)
@given(case=block_sparse_on_grid())
def test_eager_numerics_on_block_sparse_masks(case) -> None:
    mask, block, heads_q = case
    kernel = get_kernel("sparse_flex", compile=False, block_size=block)
    assert_matches_reference(kernel, mask, heads_q, max(mask.num_heads, 1))


# ----------------------------------------------------------------------------- claims
def check_claim(mask: AttnMask, block: int = 16) -> None:
    kernel = get_kernel("sparse_flex", compile=False, block_size=block)
    heads_kv = mask.num_heads
    problem = Problem(*mask.shape, 2 * heads_kv, heads_kv, 16, torch.float64)
    reasons = kernel.not_supported_reasons(problem, mask)
    if not whole_tiles(dense3(mask), block):
        (why,) = [r for r in reasons if "partly attended" in r]
        assert f"{block}x{block}" in why and f"block_size={block}" in why
        return
    assert reasons == []
    assert_matches_reference(kernel, mask, 2 * heads_kv, heads_kv)


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(6)
@given(data=st.data())
def test_claims_exactly_the_masks_made_of_whole_tiles(name, data) -> None:
    check_claim(data.draw(pattern_masks(name)))
    check_claim(data.draw(restricted(name)))


# ----------------------------------------------------------------------------- cases
S = 200
CASES = {
    "shared": (make_mask("block_sparse", S, block_size=32, density=0.4, seed=1), 32, (4, 2)),
    "per_head_gqa": (
        make_mask("block_sparse", S, block_size=32, density=0.4, seed=2, heads=2),
        32,
        (4, 2),
    ),
    "full_default_block": (make_mask("full", S), 128, (3, 1)),
    "empty_rows": (
        AttnMask.from_dense(np.kron([[1, 0], [0, 0], [1, 1]], np.ones((32, 32))).astype(bool)),
        32,
        (2, 2),
    ),
    "rectangle": (
        make_mask("block_sparse", S, block_size=32, density=0.5, seed=3).restrict(
            (32, 190), (0, 150)
        ),
        32,
        (2, 1),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_eager_matches_fp64_reference(case) -> None:
    mask, block, (hq, hkv) = CASES[case]
    kernel = get_kernel("sparse_flex", compile=False, block_size=block)
    assert kernel.not_supported_reasons(Problem(*mask.shape, hq, hkv, 16), mask) == []
    assert_matches_reference(kernel, mask, hq, hkv)


def test_refusals() -> None:
    kernel = get_kernel("sparse_flex", compile=False)
    cpu = Problem(256, 256, 4, 2, 16)
    assert kernel.not_supported_reasons(cpu, None, "fwd_bwd") == [
        "PyTorch's FlexAttention has no backward on CPU"
    ]
    causal = make_mask("causal", 256)
    (why,) = kernel.not_supported_reasons(cpu, causal)
    assert why.startswith("2 of the 3 touched 128x128 tiles are only partly attended")
    three = make_mask("block_sparse", 256, block_size=128, heads=3)
    assert kernel.not_supported_reasons(cpu, three)[0] == "mask has 3 heads, the problem 2 KV heads"
    assert kernel.returns_lse("cuda") and not get_kernel("sparse_flex").returns_lse("cpu")


@pytest.mark.slow
def test_compiled_cpu_forward_computes_only_the_selected_tiles() -> None:
    """The compiled path has no mask_mod: only the BlockMask's full tiles make it exact."""
    mask, block, (hq, hkv) = CASES["per_head_gqa"]
    kernel = get_kernel("sparse_flex", block_size=block)
    q, k, v = (t.float() for t in tensors(mask, hq, hkv))
    out, lse = kernel(q, k, v, mask)
    expected, _ = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    assert lse is None
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
