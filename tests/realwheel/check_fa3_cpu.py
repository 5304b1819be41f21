"""FA3 as built here, on a CPU: the library's own Python and real operators over the emulation.

Run by ``tests/unit/test_real_wheels.py`` in the build toolchain's Python (torch 2.11.0+cu130,
which loads the wheel's ``_C.abi3.so`` without a GPU) — never collected by the project's own
pytest run (the file name is not ``test_*``). `real_wheels.load_fa3` imports
``flash_attn_interface`` from the wheel and registers the CPU emulation of
``flash_attn_3::fwd``/``bwd`` on the real operators, so every call below goes through FA3's own
autograd functions, custom ops and operator schemas; only the CUDA kernels are emulated.

Checked, each against the fp64 reference (lcab's ``reference`` kernel, autograd through the
whole attention): lcab's ``fa3`` adapter forward (out and LSE, dense and varlen calls), the
backward through FA3's own autograd, and the backward from merged statistics block by block
through FA3's real ``_flash_attn_backward`` custom op (what a ring calls); and the record of
``tests/unit/data/real_schemas/fa3.json`` against the live objects.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch

from lcab.kernels import Problem, flash_backward, get_kernel
from lcab.kernels.upstream import flash_attn as fa_table
from lcab.masks import AttnMask, list_masks, make_mask
from tests.helpers import emulated_flash_attn_3, real_schemas, real_wheels
from tests.helpers.contract import tensors

TOL = 1e-10


def accepted(name: str) -> bool:
    return not get_kernel("fa3").mask_reasons(mask_of(name))


MASKS = {
    "causal": lambda: make_mask("causal", 48),
    "sliding_window": lambda: make_mask("sliding_window", 48, window=5),
    "causal_document": lambda: make_mask(
        "causal_document", 48, seed=3, doc_source="uniform", min_doc_len=3, max_doc_len=20
    ),
}
CUTS = ((0, 48), (0, 24, 48), (0, 7, 30, 48))


def mask_of(name: str) -> AttnMask:
    """A 48-token mask of every pattern (block sizes that divide it)."""
    options = {"block_causal_document": {"block_size": 8}, "global_sliding_window": {
        "global_tokens": 4, "window": 6}}  # fmt: skip
    return make_mask(name, 48, **options.get(name, {}))


@pytest.fixture(scope="module", autouse=True)
def fa3():
    return real_wheels.load_fa3()


def reference(mask: AttnMask, q, k, v, dout):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = get_kernel("reference")(*leaves, mask)
    out.backward(dout)
    return out.detach(), lse.detach(), [leaf.grad for leaf in leaves]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), "empty rows differ"
    scale = float(want[finite].abs().max()) or 1.0
    return float((got[finite] - want[finite]).abs().max()) / scale


def test_the_record_is_what_the_wheel_defines(fa3) -> None:
    """tests/unit/data/real_schemas/fa3.json matches the live operators and callables (the
    CPU kernels this process registered aside: the record was read before any)."""
    site = Path(os.environ[real_wheels.SITE_ENV])
    live = real_schemas.record("fa3", site, site.parent / "build.json")
    committed = real_schemas.load("fa3")

    def without_cpu(entries: dict) -> dict:
        return {
            name: {**entry, "kernels": [k for k in entry.get("kernels", []) if k != "CPU"]}
            for name, entry in entries.items()
        }

    assert without_cpu(live["operators"]) == without_cpu(committed["operators"])
    assert without_cpu(live["callables"]) == without_cpu(committed["callables"])
    for key in ("commit", "submodules", "flags"):
        assert live["provenance"][key] == committed["provenance"][key]


def test_the_real_ops_have_cuda_kernels_only_until_the_emulation_is_registered(fa3) -> None:
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
    """Every mask lcab's adapter accepts (the refused ones are refused before any call)."""
    mask = mask_of(mask_name)
    if not accepted(mask_name):
        pytest.skip(f"fa3 refuses {mask_name}: {get_kernel('fa3').mask_reasons(mask)[0]}")
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    want_out, want_lse, want_grads = reference(mask, q, k, v, dout)
    emulated_flash_attn_3.CALLS.clear()
    prepared = get_kernel("fa3").prepare(mask, Problem.of(q, k))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = prepared.run(*leaves)
    assert relative(out.detach(), want_out) <= TOL
    assert relative(lse.detach(), want_lse) <= TOL
    out.backward(dout)
    for leaf, want in zip(leaves, want_grads, strict=True):
        assert relative(leaf.grad, want) <= TOL
    ran = [call["fn"] for call in emulated_flash_attn_3.CALLS]
    assert "fwd" in ran and "bwd" in ran  # the real ops dispatched to the emulation


@pytest.mark.parametrize("cuts", CUTS, ids=lambda c: f"{len(c) - 1}-blocks")
@pytest.mark.parametrize("mask_name", ["causal", "causal_document", "sliding_window"])
def test_backward_from_merged_statistics_through_the_real_custom_op(mask_name, cuts) -> None:
    """Per key block with the whole row's (out, lse), as a ring calls it."""
    mask = MASKS[mask_name]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    out, lse, want = reference(mask, q, k, v, dout)
    kernel = get_kernel("fa3")
    dq, dks, dvs = torch.zeros_like(q), [], []
    for k0, k1 in itertools.pairwise(cuts):
        block = mask.restrict((0, mask.seqlen_q), (k0, k1))
        refused = kernel.mask_reasons(block)
        if refused:  # a ring never sends it to FA3 either (lcab refuses the cell)
            pytest.skip(f"fa3 refuses keys {k0}:{k1} of {mask_name}: {refused[0]}")
        prepared = kernel.prepare(block, Problem.of(q, k[k0:k1]))
        prepared.run(q, k[k0:k1], v[k0:k1])
        gq, gk, gv = prepared.backward(dout, q, k[k0:k1], v[k0:k1], out, lse)
        dq += gq
        dks.append(gk)
        dvs.append(gv)
    got = (dq, torch.cat(dks), torch.cat(dvs))
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert relative(g, w) <= TOL, name
    assert any(call["fn"] == "bwd" for call in emulated_flash_attn_3.CALLS)


def test_the_build_refuses_what_it_was_built_without() -> None:
    """fp16 was switched off at build time: the real op's CPU path says so, as the GPU's would."""
    mask = MASKS["causal"]()
    q, k, v, _ = tensors(mask, 4, 2, torch.float16, head_dim=16)
    prepared = get_kernel("fa3").prepare(mask, Problem.of(q, k))
    with pytest.raises(RuntimeError, match="does not support FP16"):
        prepared.run(q, k, v)
