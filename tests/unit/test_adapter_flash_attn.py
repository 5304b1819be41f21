"""fa2 / fa3 adapters: CPU contract tests against stand-ins of the documented APIs (no GPU).

* lowering semantics: the adapter's recorded call arguments, turned into a dense mask by an
  emulator of FlashAttention's documented rule (``tests/helpers/standin_flash_attn.py``), equal
  ``AttnMask.to_dense()`` for every mask the adapter claims (every registered pattern, and CP
  rectangles of them);
* contract: the adapter's whole path (dense vs varlen branch, layouts, GQA, LSE conversion,
  empty rows, autograd) on stand-in modules computing in float64, against lcab's fp64
  reference kernel: out, lse, dq, dk, dv;
* LSE conversion of each documented layout, and refusal of any other shape;
* the version probe: an old version or a missing keyword gives the precise skipped reason.

The production capability checks are not weakened: the tests call ``Kernel.prepare`` directly
with a CPU float problem (``not_supported_reasons`` would refuse it, as it should).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.kernels import Problem, get_kernel, packages
from lcab.kernels.library_results import lse_to_lcab
from lcab.kernels.packages import ApiNeed, PackageProbe, probe_reasons, release
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import lowering_reason, to_varlen
from tests.helpers import standin_flash_attn as standin
from tests.helpers.contract import forward_backward, tensors
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted

KERNELS = ["fa2", "fa3"]
#: Patterns every varlen kernel must claim (gpu_kernels.md §3.1: native masks).
NATIVE = {
    "full",
    "causal",
    "sliding_window",
    "sliding_window_causal",
    "full_document",
    "causal_document",
}


def install(mp: pytest.MonkeyPatch, kernel: str, **overrides) -> None:
    for name, mod in standin.STANDINS[kernel](**overrides).items():
        mp.setitem(sys.modules, name, mod)


def run_adapter(kernel: str, mask: AttnMask, q, k, v):
    """prepare + run, as the benchmark does, on a CPU float problem (test-only bypass)."""
    prepared = get_kernel(kernel).prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared.from_native(out), lse


# ----------------------------------------------------------------------------- (a) semantics
def check_lowered_call(kernel: str, mask: AttnMask, must_claim: bool = False) -> None:
    problem = Problem(*mask.shape, 2, 1, 8, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel(kernel).not_supported_reasons(problem, mask)
    claimed = lowering_reason(mask, "varlen") is None
    assert claimed or not must_claim, f"{mask!r} should be claimed"
    if not claimed:
        refusals = ("mask not expressible as varlen", "no per-KV-head masks")
        assert any(r.startswith(refusals) for r in reasons), reasons
        return
    assert not any("not expressible" in r for r in reasons)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, 2, 8, generator=gen)
    k, v = (torch.randn(mask.seqlen_k, 1, 8, generator=gen) for _ in range(2))
    if any(r.startswith("FA2 cannot apply window_size") for r in reasons):
        # FA2's own window rule (flash_api.cpp L608-609, L141-142) changes the mask: the
        # adapter must not call it, and the emulated kernel must indeed differ
        with pytest.MonkeyPatch.context() as mp, pytest.raises(ValueError, match="FA2 cannot"):
            install(mp, kernel)
            get_kernel(kernel).prepare(mask, Problem.of(q, k))
        args = to_varlen(mask)
        window = standin.fa2_applied_window(*args.window_size, args.causal, args.max_seqlen_k)
        emulated = standin.varlen_allowed(
            torch.as_tensor(args.cu_seqlens_q), torch.as_tensor(args.cu_seqlens_k), args.causal,
            window,
        )  # fmt: skip
        assert not np.array_equal(emulated.numpy(), dense3(mask)[0])
        return
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp, kernel)
        run_adapter(kernel, mask, q, k, v)
    (call,) = standin.CALLS
    got = standin.allowed_of_call(call, *mask.shape).numpy()
    want = dense3(mask)[0]
    if not np.array_equal(got, want):
        bad = tuple(np.argwhere(got != want)[0].tolist())
        raise AssertionError(f"{mask!r}: call {call['kwargs']} gives {got[bad]} at {bad}")
    single = call["fn"] == "dense"
    assert single == (call["shapes"][0][0] == 1 and len(call["shapes"][0]) == 4)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask(kernel, name, data) -> None:
    check_lowered_call(kernel, data.draw(pattern_masks(name)), must_claim=name in NATIVE)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask_cp_rectangles(kernel, name, data):
    check_lowered_call(kernel, data.draw(restricted(name)))


# ----------------------------------------------------------------------------- (b) contract
S = 96
DOCS = {"doc_source": "uniform", "min_doc_len": 7, "max_doc_len": 40}
CASES = {
    "full": (make_mask("full", S), "dense"),
    "causal": (make_mask("causal", S), "dense"),
    "sliding_window": (make_mask("sliding_window", S, window=13), "dense"),
    "sliding_window_causal": (make_mask("sliding_window_causal", S, window=13), "dense"),
    "causal_document": (make_mask("causal_document", S, seed=2, **DOCS), "varlen"),
    "full_document": (make_mask("full_document", S, seed=5, **DOCS), "varlen"),
    # a CP step: queries after the keys, Sq != Sk (bottom-right causal alignment)
    "causal_rect": (make_mask("causal", S).restrict((40, S), (0, 70)), "dense"),
    # rows 0..29 attend nothing: FA2's +inf / FA3's -inf LSE must become lcab's -inf, out 0
    "causal_empty_rows": (make_mask("causal", S).restrict((0, S), (30, S)), "varlen"),
    "document_rect": (
        make_mask("causal_document", S, seed=2, **DOCS).restrict((20, 90), (0, 90)),
        "varlen",
    ),
    # keys 0..34 belong to no query (a zero-query sequence); the window binds on the left
    "document_rect_window": (
        make_mask("causal_document", S, seed=2, **DOCS).restrict((40, S), (0, S)),
        "varlen",
    ),
}


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kernel", KERNELS)
def test_cpu_contract_adapter_matches_fp64_reference(kernel, case, heads, monkeypatch) -> None:
    mask, branch = CASES[case]
    install(monkeypatch, kernel)
    q, k, v, dout = tensors(mask, *heads, torch.float64)
    standin.CALLS.clear()
    out, lse, grads = forward_backward(lambda *t: run_adapter(kernel, mask, *t), q, k, v, dout)
    assert [c["fn"] for c in standin.CALLS] == [branch]
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    assert out.shape == q.shape and out.dtype == torch.float64
    assert lse.shape == (heads[0], mask.seqlen_q) and lse.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isposinf(lse).any() and not torch.isnan(lse).any()
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_cpu_contract_float32_and_raw_empty_row_lse_convention(kernel, monkeypatch) -> None:
    """The library's own empty-row LSE (+inf FA2, -inf FA3) is mapped to -inf, out to 0."""
    mask, _ = CASES["causal_empty_rows"]
    install(monkeypatch, kernel)
    q, k, v, _ = tensors(mask, 4, 2, torch.float32)
    standin.CALLS.clear()
    out, lse = run_adapter(kernel, mask, q, k, v)
    raw = standin.CALLS[0]["lse"]
    assert raw.shape == (4, S) and raw.dtype == torch.float32  # (H, total_q), float32
    assert (torch.isposinf if kernel == "fa2" else torch.isneginf)(raw[:, :30]).all()
    assert torch.isneginf(lse[:, :30]).all() and torch.isfinite(lse[:, 30:]).all()
    assert torch.all(out[:30] == 0) and lse.dtype == torch.float32
    ref_out, ref_lse = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse[:, 30:].double(), ref_lse[:, 30:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_cpu_contract_prepare_imports_lazily_and_names_the_package(kernel) -> None:
    """Without the package, prepare fails on import (the runner never gets there: reasons)."""
    module = next(iter(standin.STANDINS[kernel]()))
    assert module not in sys.modules
    with pytest.raises(ModuleNotFoundError, match=module):
        get_kernel(kernel).prepare(make_mask("causal", 8), Problem(8, 8, 1, 1, 8))


# ----------------------------------------------------------------------------- LSE layouts
def test_lse_to_lcab_dense_bhs_and_varlen_ht() -> None:
    lse = torch.arange(12.0).reshape(3, 4)  # (H, S)
    assert torch.equal(lse_to_lcab(lse[None], "bhs", 3, 4), lse)
    assert torch.equal(lse_to_lcab(lse, "ht", 3, 4), lse)


@pytest.mark.parametrize(
    ("shape", "layout"),
    [
        ((4, 3), "ht"),
        ((1, 4, 3), "bhs"),
        ((3, 4), "bhs"),
        ((1, 3, 4, 1), "bhs"),
        ((2, 3, 4), "bhs"),
    ],
)
def test_lse_to_lcab_refuses_undocumented_shapes(shape, layout) -> None:
    """Tokens-first, missing batch, trailing 1 or batch > 1: an error, never a silent transpose."""
    with pytest.raises(RuntimeError, match="documented"):
        lse_to_lcab(torch.zeros(shape), layout, 3, 4)


# ----------------------------------------------------------------------------- probe
CUDA_BF16 = Problem(256, 256, 8, 2, 64, torch.bfloat16, torch.device("cuda"))


def test_release_parses_the_numeric_part() -> None:
    assert release("2.8.3.post2") == (2, 8, 3)
    assert release("3.0.0b1") == (3, 0, 0)
    assert release("2.8.0+cu130torch2.11") == (2, 8, 0)
    assert release("2.3.0") < release("2.8") <= release("2.8.3")


@pytest.mark.parametrize("kernel", KERNELS)
def test_reasons_on_this_machine_name_cuda_and_the_package(kernel) -> None:
    k = get_kernel(kernel)
    assert k.caps.returns_lse and k.caps.stats_backward
    for problem in (CUDA_BF16, Problem(256, 256, 8, 2, 64)):
        text = " ".join(k.not_supported_reasons(problem))
        assert "CUDA" in text and k.caps.package in text


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Pretend CUDA is present, so the probe's import-time checks run (they need it)."""
    monkeypatch.setattr(packages, "cuda_present", lambda: True)
    return monkeypatch


def version(mp: pytest.MonkeyPatch, found: str | None) -> None:
    mp.setattr(packages, "distribution_version", lambda names: found)


@pytest.mark.parametrize("kernel", KERNELS)
def test_probe_accepts_the_documented_api(kernel, on_cuda) -> None:
    install(on_cuda, kernel)
    version(on_cuda, "2.8.3" if kernel == "fa2" else "3.0.0")
    assert get_kernel(kernel).package_reasons(CUDA_BF16.device) == []


def test_probe_old_version_without_window_size(on_cuda) -> None:
    install(on_cuda, "fa2", flash_attn_varlen_func=standin.fa2_varlen_without_window)
    version(on_cuda, "2.3.0")
    reasons = get_kernel("fa2").not_supported_reasons(CUDA_BF16)
    assert (
        "flash_attn 2.3.0 has no window_size in flash_attn_varlen_func (lcab needs >= 2.8)"
        in reasons
    )


def test_probe_old_version_alone_is_a_reason(monkeypatch) -> None:
    """No import needed: the version is read from the distribution metadata anywhere."""
    version(monkeypatch, "2.7.4.post1")
    reasons = get_kernel("fa2").not_supported_reasons(CUDA_BF16)
    assert "flash_attn 2.7.4.post1 is older than lcab's adapter supports (lcab needs >= 2.8)" in (
        reasons
    )


def test_probe_missing_keyword_with_unknown_version(on_cuda) -> None:
    install(on_cuda, "fa3", flash_attn_func=standin.fa3_flash_attn_func_before_july_2025)
    version(on_cuda, None)
    (reason,) = get_kernel("fa3").package_reasons(CUDA_BF16.device)
    assert reason.startswith(
        "flash_attn_interface (version unknown) has no return_attn_probs in flash_attn_func"
    )
    assert "2025-08-29 (203b9b3d)" in reason  # the first build returning the LSE by keyword


def test_probe_missing_function_and_failing_import(on_cuda) -> None:
    mod = standin.fa2_module()
    del mod.flash_attn_func
    on_cuda.setitem(sys.modules, "flash_attn", mod)
    version(on_cuda, "2.8.3")
    assert get_kernel("fa2").package_reasons(CUDA_BF16.device) == [
        "flash_attn 2.8.3 has no flash_attn_func (lcab needs >= 2.8)"
    ]
    broken = PackageProbe("lcab_no_such_module", ("x",), (ApiNeed("f", ()),))
    on_cuda.setattr(packages, "importable", lambda name: True)
    (reason,) = probe_reasons(broken, CUDA_BF16.device)
    assert "fails to import: ModuleNotFoundError" in reason


def test_probe_skips_import_checks_without_cuda(monkeypatch) -> None:
    """On a CPU problem or without CUDA the broken stand-in is never imported or inspected."""
    install(monkeypatch, "fa2", flash_attn_varlen_func=standin.fa2_varlen_without_window)
    version(monkeypatch, "2.8.3")
    fa2 = get_kernel("fa2").caps.requires
    assert probe_reasons(fa2, torch.device("cpu")) == []
    monkeypatch.setattr(packages, "cuda_present", lambda: False)
    assert probe_reasons(fa2, CUDA_BF16.device) == []
