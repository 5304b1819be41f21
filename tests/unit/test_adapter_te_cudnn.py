"""cudnn adapter: CPU contract tests against a stand-in of TE's DotProductAttention (no GPU).

* lowering semantics: the adapter's recorded thd call (cu_seqlens, attn_mask_type, window),
  turned into a dense mask by an emulator of TE's documented rule
  (``tests/helpers/standin_te.py``), equals ``AttnMask.to_dense()`` for every mask the adapter
  claims — every native pattern of §3.4.2 must be claimed at square shapes; CP rectangles are
  claimed only where the alignment cannot matter;
* contract: the adapter's whole path (module construction, backend switches, GQA, (T, H·D)
  output, autograd) on the stand-in computing in float64, against lcab's fp64 reference kernel:
  out, dq, dk, dv (TE's module returns no LSE: ``returns_lse=False``);
* the version probe (constructor and ``forward`` keywords), and the reasons.
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.kernels import Problem, get_kernel, packages
from lcab.kernels.te_cudnn import BACKEND_ENV
from lcab.kernels.upstream import cudnn as te_table
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import lowering_reason
from tests.helpers import standin_te as standin
from tests.helpers.contract import tensors
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted

NATIVE = {
    "full",
    "causal",
    "sliding_window",
    "sliding_window_causal",
    "full_document",
    "causal_document",
}


def install(mp: pytest.MonkeyPatch, **overrides) -> None:
    for name, mod in standin.modules(**overrides).items():
        mp.setitem(sys.modules, name, mod)
    for name in BACKEND_ENV:
        mp.delenv(name, raising=False)  # prepare must set them


def run_adapter(mask: AttnMask, q, k, v):
    prepared = get_kernel("cudnn").prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared.from_native(out), lse


# ----------------------------------------------------------------------------- (a) semantics
def check_lowered_call(mask: AttnMask, must_claim: bool = False) -> None:
    problem = Problem(*mask.shape, 2, 1, 64, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("cudnn").not_supported_reasons(problem, mask)
    refusals = [r for r in reasons if r.startswith(("mask not", "no per-KV-head"))]
    assert (lowering_reason(mask, "varlen") is None) or refusals, reasons
    assert not refusals or not must_claim, f"{mask!r} should be claimed: {refusals}"
    if refusals:
        return
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, 2, 8, generator=gen)
    k, v = (torch.randn(mask.seqlen_k, 1, 8, generator=gen) for _ in range(2))
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp)
        run_adapter(mask, q, k, v)
    (call,) = standin.CALLS
    got, want = standin.allowed_of_call(call).numpy(), dense3(mask)[0]
    if not np.array_equal(got, want):
        bad = tuple(np.argwhere(got != want)[0].tolist())
        raise AssertionError(f"{mask!r}: call {call} gives {got[bad]} at {bad}")


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask(name, data) -> None:
    check_lowered_call(data.draw(pattern_masks(name)), must_claim=name in NATIVE)


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask_cp_rectangles(name, data) -> None:
    check_lowered_call(data.draw(restricted(name)))


# ----------------------------------------------------------------------------- (b) contract
S = 96
DOCS = {"doc_source": "uniform", "min_doc_len": 7, "max_doc_len": 40}
CASES = {
    "full": make_mask("full", S),
    "causal": make_mask("causal", S),
    "sliding_window": make_mask("sliding_window", S, window=13),
    "sliding_window_causal": make_mask("sliding_window_causal", S, window=13),
    "causal_document": make_mask("causal_document", S, seed=2, **DOCS),
    "full_document": make_mask("full_document", S, seed=5, **DOCS),
    # CP rectangles that stay exact: a full rectangle, and a document mask's square block
    "full_rect": make_mask("full", S).restrict((40, S), (0, 70)),
    "document_block": make_mask("causal_document", S, seed=2, **DOCS).restrict((30, 80), (30, 80)),
}


def forward_backward(fn, q, k, v, dout):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), lse, grads


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_contract_adapter_matches_fp64_reference(case, heads, monkeypatch) -> None:
    mask = CASES[case]
    problem = Problem(*mask.shape, *heads, 64, torch.bfloat16, torch.device("cuda"))
    assert not any(r.startswith("mask") for r in get_kernel("cudnn").not_supported_reasons(
        problem, mask))  # fmt: skip
    install(monkeypatch)
    q, k, v, dout = tensors(mask, *heads, torch.float64)
    standin.CALLS.clear()
    out, lse, grads = forward_backward(lambda *t: run_adapter(mask, *t), q, k, v, dout)
    assert len(standin.CALLS) == 1 and lse is None
    ref_out, _, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    assert out.shape == q.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


def test_cpu_contract_prepare_imports_lazily_and_names_the_package() -> None:
    assert "transformer_engine" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="transformer_engine"):
        get_kernel("cudnn").prepare(make_mask("causal", 8), Problem(8, 8, 1, 1, 8))


# ----------------------------------------------------------------------------- reasons, probe
CUDA_BF16 = Problem(256, 256, 8, 2, 128, torch.bfloat16, torch.device("cuda"))


def reasons_of(mask: AttnMask) -> list[str]:
    problem = Problem(*mask.shape, 8, 2, 128, torch.bfloat16, torch.device("cuda"))
    return get_kernel("cudnn").not_supported_reasons(problem, mask)


def test_reasons_on_this_machine_and_caps() -> None:
    k = get_kernel("cudnn")
    assert not k.caps.returns_lse and not k.caps.stats_backward
    for problem in (CUDA_BF16, Problem(256, 256, 8, 2, 128)):
        text = " ".join(k.not_supported_reasons(problem))
        assert "CUDA" in text and "transformer_engine" in text
    odd = Problem(256, 256, 8, 2, 100, torch.bfloat16, torch.device("cuda"))
    assert "head_dim 100 is not a multiple of 8 (cuDNN)" in k.not_supported_reasons(odd)


def test_unaligned_rectangles_and_empty_sequences_are_refused() -> None:
    causal_rect = make_mask("causal", 64).restrict((32, 64), (0, 64))
    assert any("TE's causal/window alignment" in r for r in reasons_of(causal_rect))
    empty_rows = make_mask("causal", 64).restrict((0, 64), (30, 64))
    assert any("no queries or no keys" in r for r in reasons_of(empty_rows))


def test_backend_switch_set_against_cudnn_is_a_reason(monkeypatch) -> None:
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    assert "NVTE_FUSED_ATTN=0 would keep TE off cuDNN" in get_kernel("cudnn").extra_reasons(
        CUDA_BF16, "fwd"
    )


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(packages, "cuda_present", lambda: True)
    return monkeypatch


def test_probe_accepts_the_documented_api(on_cuda) -> None:
    install(on_cuda)
    on_cuda.setattr(packages, "distribution_version", lambda names: "2.20.2")
    assert get_kernel("cudnn").package_reasons(CUDA_BF16.device) == []


def test_probe_refuses_an_older_module(on_cuda) -> None:
    install(on_cuda, DotProductAttention=standin.DotProductAttentionBefore2)
    on_cuda.setattr(packages, "distribution_version", lambda names: "1.9.0")
    reasons = get_kernel("cudnn").package_reasons(CUDA_BF16.device)
    assert reasons == [
        "transformer_engine.pytorch 1.9.0 has no window_size, softmax_scale in "
        "DotProductAttention (lcab needs >= 2.0 (written against 2.20))",
        "transformer_engine.pytorch 1.9.0 has no window_size in DotProductAttention.forward "
        "(lcab needs >= 2.0 (written against 2.20))",
    ]


def test_probe_old_version(monkeypatch) -> None:
    monkeypatch.setattr(packages, "distribution_version", lambda names: "1.13.0")
    (reason,) = get_kernel("cudnn").package_reasons(CUDA_BF16.device)
    assert "1.13.0 is older than lcab's adapter supports" in reason


# ----------------------------------------------------------------------------- upstream rows
def test_standin_module_has_the_rows_signatures() -> None:
    """Constructor and forward accept what TE 2.20.2's do; FA's ``cu_seqlens_k`` is refused."""
    assert inspect.signature(standin.DotProductAttention) == (
        te_table.DOT_PRODUCT_ATTENTION.signature()
    )
    assert inspect.signature(standin.DotProductAttention.forward) == (
        te_table.DOT_PRODUCT_ATTENTION_FORWARD.signature()
    )
    module = standin.DotProductAttention(2, 8, qkv_format="thd")
    q = torch.zeros(4, 2, 8)
    with pytest.raises(TypeError, match="cu_seqlens_k"):
        module(q, q, q, cu_seqlens_k=torch.tensor([0, 4], dtype=torch.int32))
