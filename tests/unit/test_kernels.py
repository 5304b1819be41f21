"""Every registered kernel × every mask × fwd/bwd against the fp64 reference (registry-driven).

A kernel that cannot run a case must say why (`not_supported_reasons`), and a kernel that says
it can must match the reference: out and lse in the forward, dq/dk/dv in the backward.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lcab.kernels import KERNELS, Problem, get_kernel
from lcab.kernels.base import proof_on_cpu
from lcab.masks import get_pattern, list_masks, make_mask
from tests.helpers.mask_reference import reference_of

S = 160
HEADS = [(4, 4), (4, 2)]  # MHA and GQA
# Options that make a kernel testable on CPU in CI (compiling Flex takes ~30 s per shape).
OPTIONS = {"flex": {"compile": False}, "sparse_flex": {"compile": False}}


def mask_for(name: str, heads_kv: int):
    """The pattern's mid-sized example (`tests.helpers.mask_reference`), one mask per KV head."""
    params = dict(reference_of(name).example)
    if "heads" in get_pattern(name).param_names():
        params["heads"] = heads_kv
    return make_mask(name, S, seed=3, **params)


def inputs(hq: int, hkv: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(S, hq, 16, generator=gen, dtype=dtype)
    k = torch.randn(S, hkv, 16, generator=gen, dtype=dtype)
    v = torch.randn(S, hkv, 16, generator=gen, dtype=dtype)
    dout = torch.randn(S, hq, 16, generator=gen, dtype=dtype)
    return q, k, v, dout


def reference(q, k, v, dout, mask):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = get_kernel("reference")(*leaves, mask)
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), lse.detach(), grads


def close(x, ref, tol):
    x, ref = x.double(), ref.double()
    return not torch.isnan(x).any() and float((x - ref).abs().max()) <= tol * max(
        float(ref.abs().max()), 1e-12
    )


@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa"])
@pytest.mark.parametrize("mask_name", list_masks())
@pytest.mark.parametrize("kernel_name", KERNELS.names())
def test_kernel_matches_reference(kernel_name, mask_name, heads):
    hq, hkv = heads
    kernel = get_kernel(kernel_name, **OPTIONS.get(kernel_name, {}))
    mask = mask_for(mask_name, hkv)
    dtype = torch.float64 if "float64" in kernel.caps.dtypes else torch.float32
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    q, k, v, dout = inputs(hq, hkv, dtype)
    problem = Problem.of(q, k)
    fwd_reasons = kernel.not_supported_reasons(problem, mask, "fwd")
    if fwd_reasons:
        assert all(isinstance(r, str) and r for r in fwd_reasons)
        pytest.skip("; ".join(fwd_reasons))
    ref_out, ref_lse, ref_grads = reference(q.double(), k.double(), v.double(), dout.double(), mask)
    with torch.no_grad():
        out, lse = kernel(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == dtype
    assert close(out, ref_out, tol), kernel_name
    if lse is not None:
        assert lse.shape == (hq, S)
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        finite = ~torch.isinf(ref_lse)
        assert close(lse[finite], ref_lse[finite], tol)
    if kernel.not_supported_reasons(problem, mask, "bwd"):
        return
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = kernel(*leaves, mask)
    out.backward(dout)
    for leaf, ref in zip(leaves, ref_grads, strict=True):
        assert leaf.grad is not None and close(leaf.grad, ref, tol * 10), kernel_name


@pytest.mark.parametrize("kernel_name", KERNELS.names())
def test_reasons_are_consistent_with_caps(kernel_name):
    kernel = get_kernel(kernel_name)
    cpu = Problem(256, 256, 8, 2, 64, torch.float32)
    reasons = kernel.not_supported_reasons(cpu)
    runs_here = "cpu" in kernel.caps.devices and "float32" in kernel.caps.dtypes
    assert (not reasons) == (runs_here and not any("package" in r for r in reasons))
    if "cpu" not in kernel.caps.devices:
        assert any("CUDA" in r for r in reasons)
        if kernel.caps.package:
            assert any(kernel.caps.package in r for r in reasons)


def test_flex_backward_on_cpu_is_skipped_with_the_precise_reason():
    kernel = get_kernel("flex", compile=False)
    reasons = kernel.not_supported_reasons(Problem(256, 256, 8, 2, 64, torch.float32), None, "bwd")
    assert reasons == ["PyTorch's FlexAttention has no backward on CPU"]


def test_rows_without_keys_give_zero_output_and_minus_inf_lse():
    mask = make_mask("causal", S).restrict((0, S), (50, S))  # rows < 50 see nothing
    q, k, v, _ = inputs(4, 2)
    for name in ("naive", "sdpa", "reference"):
        out, lse = get_kernel(name)(q, k[50:], v[50:], mask)
        assert torch.all(out[:50] == 0) and torch.isinf(lse[:, :50]).all()
        assert not math.isnan(float(out.sum()))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own, raised while compiling
def test_compiled_flex_runs_forward_on_cpu_without_lse():
    """The default (compiled) flex path: PyTorch's compiled CPU FlexAttention returns no LSE."""
    kernel = get_kernel("flex")
    assert kernel.options["compile"] and not kernel.returns_lse("cpu")
    mask = make_mask(
        "causal_document", 256, seed=1, doc_source="uniform", min_doc_len=16, max_doc_len=96
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(256, h, 16, generator=gen) for h in (4, 2, 2))
    out, lse = kernel(q, k, v, mask)
    expected, _ = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    assert lse is None
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "kernel_name", [n for n in KERNELS.names() if get_kernel(n).caps.contract_tested]
)
def test_a_kernel_reported_contract_tested_has_contract_tests(kernel_name):
    """Each adapter module lcab/kernels/X.py has its contract tests in test_adapter_X.py."""
    module = KERNELS.get(kernel_name).__module__.rsplit(".", 1)[1]
    tests = Path(__file__).parent / f"test_adapter_{module}.py"
    assert tests.exists(), f"{kernel_name} says contract_tested but {tests.name} is missing"


def test_what_is_shown_on_cpu_follows_the_capabilities():
    for name in KERNELS.names():
        caps = get_kernel(name).caps
        shown = proof_on_cpu(caps)
        if "cpu" in caps.devices:
            assert shown.startswith("runs on CPU")
        elif caps.contract_tested:
            assert shown == "CPU contract-tested"
        else:
            assert shown == "not run (CUDA only)"
