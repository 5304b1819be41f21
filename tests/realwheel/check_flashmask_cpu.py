"""FlashMask as built here, on a CPU: its own ``interface_torch`` over its real operators.

Run by ``tests/unit/test_real_wheels.py`` in the build toolchain's Python (torch 2.11.0+cu130
loads the wheel's ``flashmask/_C.abi3.so`` without a GPU); never collected by the project's own
pytest run. `real_wheels.load_flashmask` imports ``interface_torch`` from the wheel and registers
the stand-in's kernels as the CPU kernels of the real ``flashmask::fwd``/``bwd``, so lcab's
``flashmask`` adapter goes through ``flashmask_attention``'s own checks, ``FlashMaskFunc`` and the
real op schemas; only the CUDA kernels are emulated. The checks are `tests.realwheel.common`'s.
"""

from __future__ import annotations

import pytest
import torch

from lcab.kernels import flash_backward
from lcab.kernels.upstream import flashmask as table
from lcab.masks import list_masks
from tests.helpers import real_wheels
from tests.realwheel import common

# tests.helpers.standin_flashmask is imported only after the real extension is loaded: imported
# first, it would define the flashmask namespace itself, and the extension's TORCH_LIBRARY
# registering it again aborts the process


def calls() -> list:
    from tests.helpers import standin_flashmask

    return standin_flashmask.CALLS


@pytest.fixture(scope="module", autouse=True)
def interface():
    return real_wheels.load_flashmask()


def test_the_record_is_what_the_wheel_defines() -> None:
    common.assert_record_is_live("flashmask")


def test_lcab_recognises_the_real_operators(interface) -> None:
    assert interface.flashmask_cuda is torch.ops.flashmask
    for row in (table.FLASHMASK_FWD, table.FLASHMASK_BWD):
        op = getattr(interface.flashmask_cuda, row.name.split(".")[-1])
        assert flash_backward.mismatch(op, row) is None


@pytest.mark.parametrize("mask_name", list_masks())
def test_forward_and_autograd_through_flashmasks_own_python(mask_name: str) -> None:
    calls().clear()
    common.forward_and_autograd("flashmask", mask_name)
    ops = [call["op"] for call in calls()]
    assert "fwd" in ops and "bwd" in ops  # the real ops dispatched to the emulation


@pytest.mark.parametrize("cuts", common.CUTS, ids=lambda c: f"{len(c) - 1}-blocks")
@pytest.mark.parametrize("mask_name", common.RING_MASKS)
def test_backward_from_merged_statistics_through_the_real_op(mask_name, cuts) -> None:
    calls().clear()
    common.merged_backward("flashmask", mask_name, cuts)
    assert any(call["op"] == "bwd" for call in calls())
