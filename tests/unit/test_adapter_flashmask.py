"""flashmask adapter: CPU contract tests against a stand-in of FlashMask V3's torch module (no GPU).

The stand-in (``tests/helpers/standin_flashmask.py``) takes its signatures from the table
`lcab.kernels.upstream.flashmask` and its semantics from the real source (absolute row
intervals, bottom-right causal, the interface's checks, the backward op on given statistics):

* lowering semantics: the adapter's recorded ``startend_row_indices`` and ``causal``, turned
  into a dense mask by the stand-in's emulator of the kernel, equal ``AttnMask.to_dense()`` for
  every mask the adapter claims — and it claims every mask the lowering expresses, rectangles
  (context-parallel blocks) included;
* contract: the adapter's whole path (column indices per KV head, GQA, LSE (1, Hq, Sq), empty
  rows, autograd through ``FlashMaskFunc``) on the stand-in computing in float64, against lcab's
  fp64 reference kernel;
* the backward from merged statistics: ring attention at world 2 and 4 (every query chunk ×
  every key chunk, merged by LSE, each block's ``backward`` under the merged (out, lse)) gives
  the reference's dq, dk, dv for every mask pattern;
* the version probe and the reasons (head dim, the two FLAGS, the PyPI paddle).

The tests call ``Kernel.prepare`` directly with a CPU float problem (``not_supported_reasons``
would refuse it, as it should).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from lcab.kernels import Problem, get_kernel, packages
from lcab.kernels.flashmask import DETERMINISTIC_FLAG, VERSION_FLAG
from lcab.kernels.upstream.flashmask import MODULE
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import lowering_reason
from tests.helpers import standin_flashmask as standin
from tests.helpers.contract import forward_backward, ring_blocks, ring_forward_backward, tensors
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted, slice_masks

#: Arbitrary block patterns: claimed when expressible; every other pattern must be (§3.6: N).
SPARSE = {"block_sparse", "varblock_sparse"}


def install(mp: pytest.MonkeyPatch, **overrides) -> None:
    mp.setitem(sys.modules, MODULE, standin.flashmask_module(**overrides))
    mp.delenv(VERSION_FLAG, raising=False)  # unset: the interface takes version 3
    mp.delenv(DETERMINISTIC_FLAG, raising=False)


def run_adapter(mask: AttnMask, q, k, v):
    """prepare + run, as the benchmark does, on a CPU float problem (test-only bypass)."""
    prepared = get_kernel("flashmask").prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared.from_native(out), lse


# ----------------------------------------------------------------------------- (a) semantics
def check_lowered_call(mask: AttnMask, must_claim: bool = False) -> None:
    heads = mask.num_heads
    problem = Problem(*mask.shape, 2 * heads, heads, 64, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("flashmask").not_supported_reasons(problem, mask)
    lowered = lowering_reason(mask, "flashmask") is None
    mask_refusals = [r for r in reasons if "expressible" in r or "diagonal" in r or "square" in r]
    assert lowered == (not mask_refusals), reasons  # the lowering is the only mask refusal
    assert lowered or not must_claim, f"{mask!r} should be claimed: {mask_refusals}"
    if not lowered:
        return
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, 2 * heads, 8, generator=gen)
    k, v = (torch.randn(mask.seqlen_k, heads, 8, generator=gen) for _ in range(2))
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp)
        run_adapter(mask, q, k, v)
    (call,) = standin.CALLS
    got = standin.allowed_of_call(call, mask.seqlen_q)
    assert np.array_equal(got.numpy(), dense3(mask)), f"{mask!r}: the call differs from the mask"


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask(name, data) -> None:
    check_lowered_call(data.draw(pattern_masks(name)), must_claim=name not in SPARSE)


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask_cp_rectangles(name, data) -> None:
    check_lowered_call(data.draw(restricted(name)))


@fast(80)
@given(mask=slice_masks(max_heads=2))
def test_cpu_contract_random_slices_claimed_exactly_when_expressible(mask) -> None:
    check_lowered_call(mask)


# ----------------------------------------------------------------------------- (b) contract
S = 96
DOCS = {"doc_source": "uniform", "min_doc_len": 7, "max_doc_len": 40}
CASES = {
    "causal": make_mask("causal", S),
    "sliding_window": make_mask("sliding_window", S, window=13),
    "causal_document": make_mask("causal_document", S, seed=2, **DOCS),
    "full_document": make_mask("full_document", S, seed=5, **DOCS),
    "share_question": make_mask("share_question", S, seed=3),
    "prefix_lm_document": make_mask("prefix_lm_document", S, seed=4),
    "global_sliding_window": make_mask("global_sliding_window", S, window=9, global_tokens=5),
    # a square CP diagonal block of a document mask
    "document_block": make_mask("causal_document", S, seed=2, **DOCS).restrict((30, 80), (30, 80)),
    # rectangles: a causal CP block below the diagonal and one with rows that attend nothing
    "causal_rectangle": make_mask("causal", S).restrict((40, S), (0, 70)),
    "document_rectangle": make_mask("full_document", S, seed=5, **DOCS).restrict((0, 60), (30, S)),
}


def check_contract(mask: AttnMask, heads: tuple[int, int], monkeypatch) -> None:
    install(monkeypatch)
    q, k, v, dout = tensors(mask, *heads, torch.float64)
    standin.CALLS.clear()
    out, lse, grads = forward_backward(lambda *t: run_adapter(mask, *t), q, k, v, dout)
    assert [c["op"] for c in standin.CALLS] == ["fwd", "bwd"]  # autograd: FlashMask's bwd
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    assert out.shape == q.shape and lse.shape == (heads[0], mask.seqlen_q)
    assert lse.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isposinf(lse).any() and not torch.isnan(lse).any()
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_contract_adapter_matches_fp64_reference(case, heads, monkeypatch):
    check_contract(CASES[case], heads, monkeypatch)


def test_cpu_contract_per_kv_head_mask_and_empty_rows(monkeypatch) -> None:
    """Per-KV-head masks (H_mask = Hkv) with rows attending nothing in one head only."""
    causal = make_mask("causal", 48).slices
    doc = make_mask("causal_document", 48, seed=1, **DOCS).slices
    late = np.array([[20, 48, 10, 48, 0]])  # head 2: rows 0..19 attend nothing
    parts = [causal, doc, late]
    ptr = np.cumsum([0, *(len(p) for p in parts)])
    mask = AttnMask(np.concatenate(parts), 48, head_ptr=ptr)
    problem = Problem(48, 48, 6, 3, 64, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("flashmask").not_supported_reasons(problem, mask)
    assert not any(w in r for r in reasons for w in ("expressible", "documents", "heads")), reasons
    check_contract(mask, (6, 3), monkeypatch)


@pytest.mark.parametrize("raw_empty", [float("inf"), float("-inf"), float("nan")])
def test_cpu_contract_float32_and_empty_rows_whatever_flashmask_reports(raw_empty, monkeypatch):
    mask = AttnMask(np.array([[20, 48, 0, 48, 0]]), 48)  # rows 0..19 attend nothing
    install(monkeypatch)
    monkeypatch.setitem(standin.EMPTY_LSE, "value", raw_empty)
    q, k, v, _ = tensors(mask, 4, 2, torch.float32)
    standin.CALLS.clear()
    out, lse = run_adapter(mask, q, k, v)
    assert standin.CALLS[0]["lse"].shape == (1, 4, 48)
    assert torch.isneginf(lse[:, :20]).all() and torch.isfinite(lse[:, 20:]).all()
    assert torch.all(out[:20] == 0) and lse.dtype == torch.float32
    ref_out, ref_lse = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse[:, 20:].double(), ref_lse[:, 20:], rtol=1e-5, atol=1e-5)


def test_cpu_contract_prepare_imports_lazily_and_names_the_package() -> None:
    assert MODULE == "interface_torch" and MODULE not in sys.modules
    with pytest.raises(ModuleNotFoundError, match=MODULE):
        get_kernel("flashmask").prepare(make_mask("causal", 8), Problem(8, 8, 1, 1, 8))


# ----------------------------------------------------------------------------- reasons, probe
CUDA_BF16 = Problem(256, 256, 8, 2, 128, torch.bfloat16, torch.device("cuda"))


def test_reasons_on_this_machine_name_cuda_the_package_and_its_build() -> None:
    k = get_kernel("flashmask")
    assert k.caps.per_head_masks and k.caps.stats_backward
    for problem in (CUDA_BF16, Problem(256, 256, 8, 2, 128)):
        text = " ".join(k.not_supported_reasons(problem))
        assert "CUDA" in text and "'interface_torch'" in text
        assert "flashmask_interface" not in text  # the module of the unmerged PR #98
        assert "wheelhouse.sh build flashmask" in text  # PyPI's paddlepaddle-gpu has none


def test_rectangles_are_claimed() -> None:
    mask = make_mask("causal", 64).restrict((32, 64), (0, 64))
    problem = Problem(32, 64, 8, 2, 128, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("flashmask").not_supported_reasons(problem, mask)
    assert not any("square" in r or "diagonal" in r or "expressible" in r for r in reasons)


def test_version_flag_other_than_3_is_a_reason(monkeypatch) -> None:
    monkeypatch.setenv(VERSION_FLAG, "2")
    assert f"{VERSION_FLAG}=2 selects a FlashMask path other than V3" in get_kernel(
        "flashmask"
    ).extra_reasons(CUDA_BF16, "fwd")


@pytest.mark.parametrize("head_dim", [128, 256])
def test_deterministic_flag_with_a_large_head_dim_is_a_reason(head_dim, monkeypatch) -> None:
    """As the interface does (its version-2 path raises), and only above head dim 128."""
    monkeypatch.setenv(DETERMINISTIC_FLAG, "1")
    problem = Problem(256, 256, 8, 2, head_dim, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("flashmask").extra_reasons(problem, "fwd")
    assert any(DETERMINISTIC_FLAG in r for r in reasons) == (head_dim > 128)
    install(monkeypatch)
    monkeypatch.setenv(DETERMINISTIC_FLAG, "1")
    mask = make_mask("causal", 16)
    q, k, v, _ = tensors(mask, 2, 1, torch.float64, head_dim=head_dim)
    if head_dim > 128:  # the stand-in does what the interface does
        with pytest.raises(NotImplementedError):
            run_adapter(mask, q, k, v)
    else:
        run_adapter(mask, q, k, v)


def test_head_dim_not_a_multiple_of_8_is_a_reason() -> None:
    problem = Problem(256, 256, 8, 2, 100, torch.bfloat16, torch.device("cuda"))
    (why,) = [r for r in get_kernel("flashmask").extra_reasons(problem, "fwd") if "% 8" in r]
    assert "head_dim 100" in why


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(packages, "cuda_present", lambda: True)
    return monkeypatch


def test_probe_refuses_a_build_without_the_backward_op(on_cuda) -> None:
    install(on_cuda, flashmask_cuda=types.SimpleNamespace(fwd=standin.flashmask_cuda.fwd))
    on_cuda.setattr(packages, "distribution_version", lambda names: "3.0.0b1")
    (reason,) = get_kernel("flashmask").package_reasons(CUDA_BF16.device)
    assert reason.startswith("interface_torch 3.0.0b1 has no flashmask_cuda.bwd")


def test_probe_accepts_the_documented_api(on_cuda) -> None:
    install(on_cuda)
    on_cuda.setattr(packages, "distribution_version", lambda names: "3.0.0b1")
    assert get_kernel("flashmask").package_reasons(CUDA_BF16.device) == []


def test_probe_refuses_a_build_without_lse(on_cuda) -> None:
    install(on_cuda, flashmask_attention=standin.flashmask_attention_without_lse)
    on_cuda.setattr(packages, "distribution_version", lambda names: "3.0.0b1")
    (reason,) = get_kernel("flashmask").package_reasons(CUDA_BF16.device)
    assert reason.startswith(
        "interface_torch 3.0.0b1 has no return_softmax_lse in flashmask_attention"
    )


def test_probe_old_version(monkeypatch) -> None:
    monkeypatch.setattr(packages, "distribution_version", lambda names: "2.6.2")
    (reason,) = get_kernel("flashmask").package_reasons(CUDA_BF16.device)
    assert "older than lcab's adapter supports" in reason


# ----------------------------------------------------------------------------- (c) ring backward
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(4)
@given(data=st.data())
def test_cpu_contract_ring_backward_from_merged_statistics(name, world, data) -> None:
    """Every mask pattern under ring attention at world 2 and 4: the stand-in's backward op
    driven by the merged statistics gives the fp64 reference's dq, dk, dv of the whole mask."""
    mask = data.draw(pattern_masks(name, max_seqlen=90))
    assume(mask.seqlen_q >= world)
    blocks = ring_blocks(mask, world)
    assume(all(lowering_reason(mask.restrict(qs, ks), "flashmask") is None for qs, ks in blocks))
    hkv = mask.num_heads
    q, k, v, dout = tensors(mask, 2 * hkv, hkv, torch.float64, seed=data.draw(st.integers(0, 99)))
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp)
        out, lse, grads = ring_forward_backward(get_kernel("flashmask"), mask, q, k, v, dout, world)
    assert sum(c["op"] == "bwd" for c in standin.CALLS) == world * world
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    for got, want, label in zip(grads, ref_grads, "qkv", strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{label}")


def test_cpu_contract_stats_backward_hands_flashmask_the_merged_statistics(monkeypatch) -> None:
    """The op gets the merged out and LSE (batch put back), not the block's own."""
    install(monkeypatch)
    mask = make_mask("causal_document", 64, seed=1, **DOCS)
    q, k, v, dout = tensors(mask, 4, 2, torch.float64)
    part = get_kernel("flashmask").prepare(mask.restrict((0, 64), (0, 32)), Problem.of(q, k[:32]))
    merged_out, merged_lse = torch.randn_like(q), torch.randn(4, 64, dtype=torch.float64)
    standin.CALLS.clear()
    part.backward(dout, q, k[:32], v[:32], merged_out, merged_lse)
    (call,) = standin.CALLS
    assert call["op"] == "bwd" and torch.equal(call["out"][0], merged_out)
    assert torch.equal(call["softmax_lse"], merged_lse[None])
    assert call["softmax_scale"] == 16**-0.5 and call["is_causal"] is False  # a rectangle


def test_cp_refuses_a_per_head_mask_flashmask_cannot_take_in_its_blocks() -> None:
    """A per-KV-head mask under ring: the strategy checks FlashMask's lowering of every block
    (before, per-head masks skipped the check and the cell crashed in prepare)."""
    from lcab.cp import STRATEGIES

    mask = make_mask("block_sparse", 101, seed=0, block_size=16, density=0.4, heads=6)
    problem = Problem(101, 101, 24, 6, 64, torch.bfloat16, torch.device("cuda"))
    ring = STRATEGIES.get("ring")({"balance": "zigzag"}, 2)
    reasons = ring.not_supported_reasons(get_kernel("flashmask"), problem, mask, 2, "fwd")
    assert any("mask not expressible as flashmask" in r for r in reasons), reasons
