"""Block-Sparse-Attention as built here, on a CPU: its own Python over an emulated extension.

Run by ``tests/unit/test_real_wheels.py`` in the build toolchain's Python (torch 2.11.0+cu130
loads the wheel's ``block_sparse_attn_cuda`` without a GPU); never collected by the project's
own pytest run. `real_wheels.load_bsa` swaps that extension for its emulation (from the
binding's C++) under the library's ``block_sparse_attn_interface``, so lcab's ``sparse_fa2``
adapter goes through ``block_sparse_attn_func``, its custom ops, its head-type renumbering and
its block-mask conversions; only the CUDA kernels are emulated. lcab gives this kernel only
masks of whole 128x128 tiles and no backward from merged statistics (the library has none):
the 48-token masks that are not are refused, as in a sweep, and whole-tile masks of 384
tokens take their place. The LSE leaves the extension in
float32 whatever the inputs, so results are held to the fp64 reference within its precision.
"""

from __future__ import annotations

import pytest

from lcab.kernels import get_kernel
from lcab.masks import AttnMask, list_masks, make_mask
from tests.helpers import emulated_block_sparse_attn_cuda as emulated
from tests.helpers import real_wheels
from tests.realwheel import common

FLOAT32_TOL = 1e-5
"""The LSE passes through the extension's float32 buffer (the backward recomputes from it)."""


@pytest.fixture(scope="module", autouse=True)
def interface():
    return real_wheels.load_bsa()


def test_the_record_is_what_the_wheel_defines() -> None:
    common.assert_record_is_live("bsa")


@pytest.mark.parametrize("mask_name", list_masks())
def test_forward_and_autograd_through_the_librarys_own_python(mask_name: str) -> None:
    emulated.CALLS.clear()
    common.forward_and_autograd("sparse_fa2", mask_name, tol=FLOAT32_TOL)
    ops = [call["op"] for call in emulated.CALLS]
    assert "fwd" in ops and "bwd" in ops  # the library's ops reached the extension


def tiled_masks() -> dict[str, AttnMask]:
    """Masks of whole 128x128 tiles (what the library computes exactly), over 384 tokens."""
    return {
        "full": make_mask("full", 384),
        "block_sparse": make_mask("block_sparse", 384, block_size=128, seed=1),
        "block_causal_document": make_mask("block_causal_document", 384, block_size=128),
        "full_document": make_mask("full_document", 384, doc_lengths=[128, 256]),
    }


@pytest.mark.parametrize("name", sorted(tiled_masks()))
def test_whole_tiles_forward_and_autograd_through_the_librarys_own_python(name: str) -> None:
    """Three 128-token query blocks: the block lists, the renumbering and the LSE slots."""
    emulated.CALLS.clear()
    mask = tiled_masks()[name]
    assert not get_kernel("sparse_fa2").mask_reasons(mask)
    common.forward_and_autograd("sparse_fa2", name, tol=FLOAT32_TOL, mask=mask)
    assert [call["op"] for call in emulated.CALLS] == ["fwd", "bwd"]
    assert emulated.CALLS[0]["lse_shape"] == (1, 4, 384)  # (batch, heads, max_seqlen_q)
