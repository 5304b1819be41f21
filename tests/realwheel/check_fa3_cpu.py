"""FA3 as built here, on a CPU: the library's own Python and real operators over the emulation.

Run by ``tests/unit/test_real_wheels.py`` in the build toolchain's Python (torch 2.11.0+cu130,
which loads the wheel's ``_C.abi3.so`` without a GPU) — never collected by the project's own
pytest run (the file name is not ``test_*``). `real_wheels.load_fa3` imports
``flash_attn_interface`` from the wheel and registers the CPU emulation of
``flash_attn_3::fwd``/``bwd`` on the real operators, so every call below goes through FA3's own
autograd functions, custom ops and operator schemas; only the CUDA kernels are emulated
(`tests.helpers.emulated_flash_attn_3`). The checks themselves are `tests.realwheel.common`'s.
"""

from __future__ import annotations

import pytest
import torch

from lcab.kernels import flash_backward, get_kernel
from lcab.kernels.upstream import flash_attn as fa_table
from lcab.masks import list_masks
from tests.helpers import emulated_flash_attn_3, real_schemas, real_wheels
from tests.realwheel import common


@pytest.fixture(scope="module", autouse=True)
def fa3():
    return real_wheels.load_fa3()


def test_the_record_is_what_the_wheel_defines() -> None:
    common.assert_record_is_live("fa3")


def test_the_real_ops_run_on_cuda_only_until_the_emulation_is_registered() -> None:
    committed = real_schemas.load("fa3")["operators"]
    assert committed["flash_attn_3::fwd"]["kernels"] == ["CUDA"]
    for name in ("flash_attn_3::fwd", "flash_attn_3::bwd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")  # ours, now


def test_lcab_recognises_the_real_backward(fa3) -> None:
    fn = fa3._flash_attn_backward
    assert flash_backward.callable_kind(fn) == fa_table.FA3_BACKWARD.kind == "custom_op"
    assert flash_backward.fa3_generation(fn) is fa_table.FA3_BACKWARD
    assert get_kernel("fa3").library_backward_reasons() == []


@pytest.mark.parametrize("mask_name", list_masks())
def test_forward_and_autograd_through_fa3s_own_python(mask_name: str) -> None:
    emulated_flash_attn_3.CALLS.clear()
    common.forward_and_autograd("fa3", mask_name)
    ran = [call["fn"] for call in emulated_flash_attn_3.CALLS]
    assert "fwd" in ran and "bwd" in ran  # the real ops dispatched to the emulation


@pytest.mark.parametrize("cuts", common.CUTS, ids=lambda c: f"{len(c) - 1}-blocks")
@pytest.mark.parametrize("mask_name", common.RING_MASKS)
def test_backward_from_merged_statistics_through_the_real_custom_op(mask_name, cuts) -> None:
    emulated_flash_attn_3.CALLS.clear()
    common.merged_backward("fa3", mask_name, cuts)
    assert any(call["fn"] == "bwd" for call in emulated_flash_attn_3.CALLS)


def test_the_build_refuses_what_it_was_built_without() -> None:
    """fp16 was switched off at build time: the real op's CPU path says so, as the GPU's would."""
    from lcab.kernels import Problem
    from tests.helpers.contract import tensors

    mask = common.mask_of("causal")
    q, k, v, _ = tensors(mask, 4, 2, torch.float16, head_dim=16)
    prepared = get_kernel("fa3").prepare(mask, Problem.of(q, k))
    with pytest.raises(RuntimeError, match="does not support FP16"):
        prepared.run(q, k, v)
