"""MagiAttention's FFA as built here, on a CPU: its own ``flex_flash_attn_func`` over its ops.

Run by ``tests/unit/test_real_wheels.py`` in the build toolchain's Python (torch 2.11.0+cu130
loads the wheel's ``magi_attn_ext`` without a GPU); never collected by the project's own pytest
run. `real_wheels.load_ffa` registers the emulation of FFA's kernels as the CPU kernels of the
library's own custom ops, so lcab's ``ffa`` adapter goes through ``flex_flash_attn_func``, its
autograd function and its float32 buffers; only the CUDA kernels are emulated. The library
computes out, LSE and dq in float32 whatever the inputs, so results are held to the fp64
reference within float32's precision.
"""

from __future__ import annotations

import pytest
import torch

from lcab.kernels.upstream import magi_ffa as table
from lcab.masks import list_masks
from tests.helpers import emulated_magi_ffa, real_wheels
from tests.realwheel import common

FLOAT32_TOL = 1e-5
"""Out, LSE and dq pass through FFA's float32 buffers: ~1e-7 rounding, with room."""


@pytest.fixture(scope="module", autouse=True)
def functional():
    return real_wheels.load_ffa()


def test_the_record_is_what_the_wheel_defines() -> None:
    common.assert_record_is_live("ffa")


def test_lcab_reaches_the_librarys_own_functions(functional) -> None:
    import magi_attention.functional.flex_flash_attn as module

    from lcab.kernels import get_kernel

    assert functional.flex_flash_attn_func is module.flex_flash_attn_func
    assert get_kernel("ffa")._backward_fn() is getattr(module, table.FFA_BACKWARD.name)


@pytest.mark.parametrize("mask_name", list_masks())
def test_forward_and_autograd_through_ffas_own_python(mask_name: str) -> None:
    emulated_magi_ffa.CALLS.clear()
    common.forward_and_autograd("ffa", mask_name, tol=FLOAT32_TOL)
    ops = [call["op"] for call in emulated_magi_ffa.CALLS]
    assert "fwd" in ops and "bwd" in ops  # the real ops dispatched to the emulation
    assert emulated_magi_ffa.CALLS[0]["lse_dtype"] == torch.float32  # the library's buffer


@pytest.mark.parametrize("cuts", common.CUTS, ids=lambda c: f"{len(c) - 1}-blocks")
@pytest.mark.parametrize("mask_name", common.RING_MASKS)
def test_backward_from_merged_statistics_through_the_real_op(mask_name, cuts) -> None:
    emulated_magi_ffa.CALLS.clear()
    common.merged_backward("ffa", mask_name, cuts, tol=FLOAT32_TOL)
    assert any(call["op"] == "bwd" for call in emulated_magi_ffa.CALLS)
