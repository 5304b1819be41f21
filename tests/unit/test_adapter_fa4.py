"""fa4 adapter: CPU contract tests against a stand-in of flash-attn-4's documented API (no GPU).

* lowering semantics: the adapter's recorded call arguments, turned into a dense mask by an
  emulator of FA4's documented rule (``None`` = unbounded side, ints literal:
  ``tests/helpers/standin_fa4.py``), equal ``AttnMask.to_dense()`` for every mask the adapter
  claims (every registered pattern, and CP rectangles of them);
* contract: the adapter's whole path (dense vs varlen branch, layouts, GQA, LSE layout, empty
  rows, autograd) on the stand-in computing in float64, against lcab's fp64 reference kernel:
  out, lse, dq, dk, dv — and the backward from merged softmax statistics (``stats_backward``),
  which rests on FA4's differentiable LSE;
* the probe: old betas, a missing keyword, a failing import (FA2 co-install), a missing package
  and the architecture limits give precise reasons.

The tests call ``Kernel.prepare`` directly with a CPU float problem (``not_supported_reasons``
refuses CPU, as it should).
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.cp.ring_attention import merge_into
from lcab.kernels import Problem, get_kernel, packages
from lcab.kernels.fa4 import PreparedFA4
from lcab.kernels.upstream import fa4 as fa4_table
from lcab.kernels.upstream import flash_attn as flash_table
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import lowering_reason
from tests.helpers import standin_fa4 as standin
from tests.helpers.contract import forward_backward
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted

NATIVE = {
    "full",
    "causal",
    "sliding_window",
    "sliding_window_causal",
    "full_document",
    "causal_document",
}


def run_adapter(mask: AttnMask, q, k, v):
    """prepare + run, as the benchmark does, on a CPU float problem (test-only bypass)."""
    prepared = get_kernel("fa4").prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared.from_native(out), lse


# ----------------------------------------------------------------------------- (a) semantics
def check_lowered_call(mask: AttnMask, must_claim: bool = False) -> None:
    problem = Problem(*mask.shape, 2, 1, 8, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("fa4").not_supported_reasons(problem, mask)
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
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        standin.install(mp)
        run_adapter(mask, q, k, v)
    (call,) = standin.CALLS
    window = call["kwargs"]["window_size"]
    assert all(side is None or side >= 0 for side in window), window  # None, never -1
    assert call["return_lse"] is True
    got = standin.allowed_of_call(call, *mask.shape).numpy()
    want = dense3(mask)[0]
    if not np.array_equal(got, want):
        bad = tuple(np.argwhere(got != want)[0].tolist())
        raise AssertionError(f"{mask!r}: call {call['kwargs']} gives {got[bad]} at {bad}")
    single = call["fn"] == "dense"
    assert single == (call["shapes"][0][0] == 1 and len(call["shapes"][0]) == 4)


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


def test_emulator_reads_minus_one_literally() -> None:
    """The reason the adapter spells unbounded as None: FA4 would take (-1, 5) as a window."""
    band = standin.window_allowed(6, 6, False, (-1, 5))
    assert not band[2, 2] and band[2, 3]  # j >= i + 1: the diagonal itself is excluded
    assert torch.equal(
        standin.window_allowed(6, 6, True, (-1, -1)), torch.ones(6, 6, dtype=torch.bool).tril()
    )


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
    # rows 0..29 attend nothing: out 0, lse -inf
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
HEADS = pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])


def tensors(shape: tuple[int, int], hq: int, hkv: int, dtype: torch.dtype, seed: int = 11):
    gen = torch.Generator().manual_seed(seed)
    sq, sk = shape
    q = torch.randn(sq, hq, 16, generator=gen, dtype=dtype)
    k = torch.randn(sk, hkv, 16, generator=gen, dtype=dtype)
    v = torch.randn(sk, hkv, 16, generator=gen, dtype=dtype)
    dout = torch.randn(sq, hq, 16, generator=gen, dtype=dtype)
    return q, k, v, dout


def assert_matches_reference(out, lse, grads, ref_out, ref_lse, ref_grads) -> None:
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isposinf(lse).any() and not torch.isnan(lse).any()
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@HEADS
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_contract_adapter_matches_fp64_reference(case, heads, monkeypatch) -> None:
    mask, branch = CASES[case]
    standin.install(monkeypatch)
    q, k, v, dout = tensors(mask.shape, *heads, torch.float64)
    standin.CALLS.clear()
    out, lse, grads = forward_backward(lambda *t: run_adapter(mask, *t), q, k, v, dout)
    assert [c["fn"] for c in standin.CALLS] == [branch]
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    assert out.shape == q.shape and out.dtype == torch.float64
    assert lse.shape == (heads[0], mask.seqlen_q) and lse.dtype == torch.float64
    assert_matches_reference(out, lse, grads, ref_out, ref_lse, ref_grads)


STATS_CASES = ["causal", "sliding_window_causal", "causal_document", "full_document"]


@HEADS
@pytest.mark.parametrize("case", STATS_CASES)
def test_cpu_contract_backward_from_merged_statistics(case, heads, monkeypatch) -> None:
    """Ring-style CP: two key blocks, merged by LSE, each block's backward under the merged
    (out, lse) — PreparedAttention.backward through FA4's differentiable LSE — must give the
    reference's gradients of the whole mask (dq summed, dk/dv per block)."""
    mask, _ = CASES[case]
    standin.install(monkeypatch)
    q, k, v, dout = tensors(mask.shape, *heads, torch.float64, seed=3)
    split = next(  # the first key split near the middle that both blocks can lower
        s
        for s in range(S // 2 + 3, S)
        if all(
            lowering_reason(mask.restrict((0, S), keys), "varlen") is None
            for keys in ((0, s), (s, S))
        )
    )
    blocks = [(0, split), (split, S)]
    out = torch.zeros_like(q)
    lse = torch.full((heads[0], S), float("-inf"), dtype=torch.float64)
    prepared = []
    for k0, k1 in blocks:
        part = get_kernel("fa4").prepare(mask.restrict((0, S), (k0, k1)), Problem.of(q, k[k0:k1]))
        part_out, part_lse = part.run(q, k[k0:k1], v[k0:k1])
        merge_into(out, lse, part_out, part_lse)
        prepared.append(part)
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for part, (k0, k1) in zip(prepared, blocks, strict=True):
        gq, gk, gv = part.backward(dout, q, k[k0:k1], v[k0:k1], out, lse)
        dq += gq
        dks.append(gk)
        dvs.append(gv)
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    grads = (dq, torch.cat(dks), torch.cat(dvs))
    assert_matches_reference(out, lse, grads, ref_out, ref_lse, ref_grads)


def test_cpu_contract_stats_backward_needs_return_lse(monkeypatch) -> None:
    """Without return_lse FA4 drops dlse: the base backward must then refuse, not be wrong."""
    mask, _ = CASES["causal"]
    standin.install(monkeypatch)
    q, k, v, dout = tensors(mask.shape, 4, 2, torch.float64)
    part = get_kernel("fa4").prepare(mask, Problem.of(q, k))
    out, lse = part.run(q, k, v)
    part.kwargs["return_lse"] = False
    with pytest.raises(NotImplementedError, match="merged softmax statistics"):
        part.backward(dout, q, k, v, out, lse)


def test_cpu_contract_float32_empty_rows_and_raw_lse_layout(monkeypatch) -> None:
    mask, _ = CASES["causal_empty_rows"]
    standin.install(monkeypatch)
    q, k, v, _ = tensors(mask.shape, 4, 2, torch.float32)
    standin.CALLS.clear()
    out, lse = run_adapter(mask, q, k, v)
    raw = standin.CALLS[0]["lse"]
    assert raw.shape == (4, S) and raw.dtype == torch.float32  # (H, total_q), float32
    assert torch.isneginf(lse[:, :30]).all() and torch.isfinite(lse[:, 30:]).all()
    assert torch.all(out[:30] == 0) and lse.dtype == torch.float32
    ref_out, ref_lse = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse[:, 30:].double(), ref_lse[:, 30:], rtol=1e-5, atol=1e-5)


def test_cpu_contract_prepare_imports_lazily_and_names_the_package() -> None:
    assert "flash_attn.cute" not in sys.modules and "flash_attn" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="flash_attn"):
        get_kernel("fa4").prepare(make_mask("causal", 8), Problem(8, 8, 1, 1, 8))


# ----------------------------------------------------------------------------- probe
CUDA_BF16 = Problem(256, 256, 8, 2, 64, torch.bfloat16, torch.device("cuda"))


def test_reasons_on_this_machine_name_cuda_and_the_package() -> None:
    k = get_kernel("fa4")
    assert k.caps.returns_lse and k.caps.stats_backward
    for problem in (CUDA_BF16, Problem(256, 256, 8, 2, 64)):
        text = " ".join(k.not_supported_reasons(problem))
        assert "CUDA" in text and "flash_attn.cute" in text and "lcab[fa4]" in text


def test_missing_or_broken_parent_package_is_a_reason_not_a_crash(monkeypatch) -> None:
    """find_spec('flash_attn.cute') imports the parent; without it the kernel still answers."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # importing flash_attn now fails
    monkeypatch.setattr(packages, "distribution_version", lambda names: None)
    reasons = get_kernel("fa4").not_supported_reasons(CUDA_BF16)
    assert any(r.startswith("needs package 'flash_attn.cute', not installed") for r in reasons)


@pytest.mark.parametrize(
    ("version", "too_old"),
    [
        ("4.0.0b4", True),
        ("4.0.0b5", False),
        ("4.0.0b36", False),
        ("4.0.0", False),
        ("4.1.0", False),
        ("3.0.0", True),
        ("0.0.0", False),  # setuptools-scm's fallback: unknown, left to the signature check
        (None, False),
    ],
)
def test_version_reasons_compare_the_beta_number(version, too_old, monkeypatch) -> None:
    """The minimum is a beta, so the probe compares pre-releases (`packages.older_than`)."""
    versions(monkeypatch, version)
    reasons = get_kernel("fa4").package_reasons(CUDA_BF16.device)
    assert bool(reasons) == too_old
    if too_old:
        assert reasons == [
            f"flash_attn.cute {version} is older than lcab's adapter supports (lcab needs "
            "flash-attn-4 >= 4.0.0b5, the first release whose backward takes the gradient of "
            "the LSE)"
        ]


@pytest.fixture
def on_gpu(monkeypatch: pytest.MonkeyPatch):
    """Pretend CUDA is present on an sm_XY GPU, so the import-time checks run."""
    monkeypatch.setattr(packages, "cuda_present", lambda: True)

    def gpu(capability: tuple[int, int]) -> pytest.MonkeyPatch:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        return monkeypatch

    return gpu


def versions(mp: pytest.MonkeyPatch, fa4: str | None, fa2: str | None = None) -> None:
    found = {"flash-attn-4": fa4, "flash-attn": fa2}
    mp.setattr(packages, "distribution_version", lambda names: found.get(names[0]))


def test_probe_accepts_the_documented_api_on_hopper(on_gpu) -> None:
    mp = on_gpu((9, 0))
    standin.install(mp)
    versions(mp, "4.0.0b36")
    assert get_kernel("fa4").package_reasons(CUDA_BF16.device) == []
    assert get_kernel("fa4").extra_reasons(CUDA_BF16, "fwd_bwd") == []


def test_probe_missing_return_lse(on_gpu) -> None:
    mp = on_gpu((9, 0))
    standin.install(mp, flash_attn_func=standin.flash_attn_func_before_return_lse)
    versions(mp, None)
    assert get_kernel("fa4").package_reasons(CUDA_BF16.device) == [
        "flash_attn.cute (version unknown) has no return_lse in flash_attn_func (lcab needs "
        "flash-attn-4 >= 4.0.0b5, the first release whose backward takes the gradient of the LSE)"
    ]


def test_probe_old_beta_without_import(monkeypatch) -> None:
    versions(monkeypatch, "4.0.0b3")
    reasons = get_kernel("fa4").not_supported_reasons(CUDA_BF16)
    assert any(r.startswith("flash_attn.cute 4.0.0b3 is older than") for r in reasons)


def test_probe_failing_import_names_the_fa2_co_install(on_gpu) -> None:
    mp = on_gpu((9, 0))
    mp.setitem(sys.modules, "flash_attn", None)  # FA2's flash_attn/__init__ fails
    versions(mp, "4.0.0b36", fa2="2.8.3")
    (reason,) = get_kernel("fa4").package_reasons(CUDA_BF16.device)
    assert reason.startswith("flash_attn.cute 4.0.0b36 is installed but fails to import: ")
    assert reason.endswith(
        "; flash-attn 2.8.3 (FA2) is installed too and its flash_attn/__init__.py runs first: "
        "repair or uninstall it"
    )


def test_no_backward_on_ampere_and_sm100_head_dims(on_gpu) -> None:
    mp = on_gpu((8, 0))
    standin.install(mp)
    versions(mp, "4.0.0b36")
    fa4 = get_kernel("fa4")
    assert fa4.extra_reasons(CUDA_BF16, "fwd") == []
    assert fa4.extra_reasons(CUDA_BF16, "bwd") == [
        "FA4's backward needs sm90 or later (this GPU is sm_80)"
    ]
    on_gpu((10, 0))
    wide = Problem(256, 256, 8, 2, 192, torch.bfloat16, torch.device("cuda"))
    assert fa4.extra_reasons(wide, "fwd") == [
        "FA4 on sm_100 takes head dims 8..128 or 256, not 192"
    ]
    assert (
        fa4.extra_reasons(Problem(64, 64, 2, 2, 256, torch.bfloat16, CUDA_BF16.device), "fwd") == []
    )


@pytest.mark.parametrize("head_dim", [4, 60, 264])
def test_head_dims_outside_8_to_256_in_eights_are_refused(head_dim) -> None:
    problem = Problem(64, 64, 2, 2, head_dim, torch.bfloat16, torch.device("cuda"))
    text = " ".join(get_kernel("fa4").not_supported_reasons(problem))
    assert "head dims 8..256 in multiples of 8" in text or f"head_dim {head_dim} > 256" in text


def test_probe_skips_import_checks_without_cuda(monkeypatch) -> None:
    standin.install(monkeypatch, flash_attn_func=standin.flash_attn_func_before_return_lse)
    versions(monkeypatch, "4.0.0b36")
    monkeypatch.setattr(packages, "cuda_present", lambda: False)
    assert get_kernel("fa4").package_reasons(CUDA_BF16.device) == []


# ----------------------------------------------------------------------------- upstream rows
def test_standin_signatures_are_the_rows() -> None:
    """The stand-in accepts exactly the calls the table (held to the wheel) says FA4 accepts."""
    for fn, row in (
        (standin.flash_attn_func, fa4_table.FLASH_ATTN_FUNC),
        (standin.flash_attn_varlen_func, fa4_table.FLASH_ATTN_VARLEN_FUNC),
    ):
        assert inspect.signature(fn) == row.signature()
    q = torch.zeros(1, 4, 1, 8)
    with pytest.raises(TypeError, match="return_softmax_lse"):  # FA3's spelling, not FA4's
        standin.flash_attn_func(q, q, q, return_softmax_lse=True)
    with pytest.raises(TypeError):  # one argument more than the 23 the wheel defines
        standin.flash_attn_func(q, q, q, None, None, None, False, (None, None), None, 0.0, 1,
                                None, False, None, None, None, None, None, None, None, True,
                                False, None, "one too many")  # fmt: skip


def test_a_pair_with_one_negative_side_is_a_window() -> None:
    """FA4 drops the window only when both sides are negative (L438-459): (-1, 0) stays one."""
    assert not bool(standin.window_allowed(6, 6, False, (-1, 0)).all())
    assert bool(standin.window_allowed(6, 6, False, (-3, -1)).all())


def test_the_adapter_reads_the_lse_as_the_table_states() -> None:
    """PreparedFlash reads FA2's layouts; FA4's table must state the same, and a gradient."""
    assert fa4_table.FLASH_ATTN_FUNC.lse == fa4_table.LSE
    assert (fa4_table.LSE.layout, fa4_table.FLASH_ATTN_VARLEN_FUNC.lse.layout) == (
        flash_table.FA2_LSE.layout,
        flash_table.FA2_LSE.varlen_layout,
    )
    assert PreparedFA4.lse_grad is fa4_table.LSE.differentiable is True
