"""torch_varlen: CPU contract tests of lcab's call into ``torch.nn.attention.varlen`` (no GPU).

torch's ``varlen_attn`` computes only on CUDA. Two things stand in for the GPU:

* torch's own meta kernel: the adapter's whole path (prepare, the call, the LSE's layout, empty
  rows) runs on meta tensors, where ``varlen_attn``'s registered fake kernel decides the shapes —
  the LSE is (H_q, T_q), and an adapter reading it as (T_q, H_q) fails here;
* for the numbers, a plain-torch stand-in built from the table rows
  (``tests/helpers/standin_torch_varlen.py``, signatures and LSE layout from
  `lcab.kernels.upstream.torch_attention`), compared with lcab's fp64 reference; the emulated
  call mask must equal ``AttnMask.to_dense()`` for every mask the adapter claims;
* the backward from merged statistics (torch's ``_varlen_attn_backward`` op): ring attention at
  world 2 and 4 against the reference's gradients, and the call on meta tensors against the
  real op.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from lcab.kernels import Problem, get_kernel, torch_varlen
from lcab.kernels.library_results import lse_to_lcab
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import lowering_reason
from tests.helpers import standin_torch_varlen as standin
from tests.helpers.contract import forward_backward, ring_blocks, ring_forward_backward, tensors
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted
from tests.helpers.standin_flash_attn import varlen_allowed

CALLS = standin.CALLS
STANDIN = standin.varlen_module()


def run(mask: AttnMask, q, k, v):
    prepared = torch_varlen._PreparedTorchVarlen(mask, Problem.of(q, k), STANDIN)
    return prepared.run(q, k, v)


def claimed(mask: AttnMask) -> bool:
    return lowering_reason(mask, "varlen") is None and not torch_varlen.mask_reasons(mask)


def check_call(mask: AttnMask) -> None:
    if not claimed(mask):
        problem = Problem(*mask.shape, 2, 1, 8, torch.bfloat16, torch.device("cuda"))
        reasons = get_kernel("torch_varlen").not_supported_reasons(problem, mask)
        assert any("varlen" in r or "per-KV-head" in r for r in reasons), reasons
        return
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, 2, 8, generator=gen)  # GQA 2:1
    k, v = (torch.randn(mask.seqlen_k, 1, 8, generator=gen) for _ in range(2))
    CALLS.clear()
    run(mask, q, k, v)
    (call,) = CALLS
    got = varlen_allowed(call["cu_q"], call["cu_k"], False, call["window_size"]).numpy()
    assert np.array_equal(got, dense3(mask)[0]), f"{mask!r}: window {call['window_size']}"


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask(name, data):
    check_call(data.draw(pattern_masks(name)))


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask_cp_rectangles(name, data):
    check_call(data.draw(restricted(name)))


S = 96
DOCS = {"doc_source": "uniform", "min_doc_len": 7, "max_doc_len": 40}
MASKS = {
    "full": make_mask("full", S),
    "causal": make_mask("causal", S),
    "sliding_window_causal": make_mask("sliding_window_causal", S, window=13),
    "sliding_window": make_mask("sliding_window", S, window=13),
    "causal_document": make_mask("causal_document", S, seed=2, **DOCS),
    "full_document": make_mask("full_document", S, seed=5, **DOCS),
    "full_rect": make_mask("full", S).restrict((40, S), (0, 70)),
}


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("name", list(MASKS))
def test_cpu_contract_adapter_matches_the_fp64_reference(name, heads):
    mask, (hq, hkv) = MASKS[name], heads
    assert claimed(mask)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(mask.seqlen_q, hq, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(mask.seqlen_k, hkv, 16, generator=gen, dtype=torch.float64) for _ in "kv")
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = run(mask, *leaves)
    out.backward(dout)
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, ref_lse = get_kernel("reference")(*ref, mask)
    ref_out.backward(dout)
    assert lse is not None and lse.shape == (hq, mask.seqlen_q)
    assert torch.allclose(out, ref_out, atol=1e-10)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse[finite], ref_lse[finite], atol=1e-10)
    for got, want in zip(leaves, ref, strict=True):
        assert torch.allclose(got.grad, want.grad, atol=1e-9)


def test_rows_attending_nothing_get_lcabs_convention_not_the_librarys():
    mask = make_mask("full", S).restrict((0, S), (0, S))
    docs = make_mask("full_document", S, seed=5, **DOCS).restrict((0, S), (50, S))
    for m in (mask, docs):
        q = torch.randn(m.seqlen_q, 2, 8, dtype=torch.float64)
        k = v = torch.randn(m.seqlen_k, 2, 8, dtype=torch.float64)
        out, lse = run(m, q, k, v)
        empty = ~m.to_dense().any(-1)
        assert torch.all(out[empty] == 0) and torch.all(lse[:, empty] == float("-inf"))


def test_a_causal_rectangle_of_unequal_lengths_is_refused_with_why():
    mask = make_mask("causal", S).restrict((40, S), (0, 70))
    (why,) = torch_varlen.mask_reasons(mask)
    assert "queries" in why and "does not document causal/window alignment" in why


def test_this_torch_has_the_api_and_a_missing_keyword_is_a_precise_reason(monkeypatch):
    assert torch_varlen.api_reasons() == []
    import torch.nn.attention.varlen as varlen

    def old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None):
        raise AssertionError("never called")

    monkeypatch.setattr(varlen, "varlen_attn", old)
    (why,) = torch_varlen.api_reasons()
    assert f"torch {torch.__version__}'s varlen_attn has no window_size, enable_gqa" == why


# ----------------------------------------------------------------------------- torch's own kernels
META_CASES = {
    "causal_document": make_mask("causal_document", S, seed=2, **DOCS),
    "sliding_window_causal": make_mask("sliding_window_causal", S, window=13),
    "empty_rows": make_mask("full_document", S, seed=5, **DOCS).restrict((0, S), (50, S)),
}


@pytest.mark.parametrize("heads", [(6, 6), (6, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("name", list(META_CASES))
def test_adapter_runs_on_torchs_own_meta_kernel_of_varlen_attn(name, heads):
    """The real ``varlen_attn`` on meta tensors: its fake kernel gives (H_q, T_q), and the
    adapter must turn that into lcab's (H_q, S_q) — an adapter expecting (T_q, H_q) raises."""
    mask, (hq, hkv) = META_CASES[name], heads
    meta = torch.device("meta")
    problem = Problem(mask.seqlen_q, mask.seqlen_k, hq, hkv, 64, torch.bfloat16, meta)
    prepared = get_kernel("torch_varlen").prepare(mask, problem)
    q = torch.empty(mask.seqlen_q, hq, 64, dtype=torch.bfloat16, device=meta)
    k, v = (torch.empty(mask.seqlen_k, hkv, 64, dtype=torch.bfloat16, device=meta) for _ in "kv")
    _, raw_lse = prepared.fn(q, k, v, *prepared.positional, **prepared.kwargs)
    assert raw_lse.shape == (hq, mask.seqlen_q) and raw_lse.dtype == torch.float32
    with pytest.raises(RuntimeError, match="documented th layout"):
        lse_to_lcab(raw_lse, "th", hq, mask.seqlen_q)  # the old misreading, on torch's answer
    out, lse = prepared.run(q, k, v)
    assert out.shape == (mask.seqlen_q, hq, 64) and out.device == meta
    assert lse is not None and lse.shape == (hq, mask.seqlen_q) and lse.dtype == torch.float32


def test_the_call_on_fake_cuda_tensors_gives_torchs_layout():
    """Under FakeTensorMode with CUDA fake tensors (what a GPU would see), the adapter's call
    comes back with the LSE in the layout its table row states."""
    mask = META_CASES["causal_document"]
    prepared = get_kernel("torch_varlen").prepare(mask, Problem(S, S, 4, 2, 64, torch.bfloat16))
    cu_q, cu_k, max_q, max_k = prepared.positional  # host tensors: a fake CUDA copy is made
    with FakeTensorMode():  # of their values (a CPU build of torch cannot move to fake CUDA)
        cuda = torch.device("cuda")
        q = torch.empty(S, 4, 64, dtype=torch.bfloat16, device=cuda)
        k = v = torch.empty(S, 2, 64, dtype=torch.bfloat16, device=cuda)
        cu = [torch.tensor(c.tolist(), dtype=torch.int32, device=cuda) for c in (cu_q, cu_k)]
        out, lse = prepared.fn(q, k, v, *cu, max_q, max_k, **prepared.kwargs)
        assert lse.device.type == "cuda" and out.shape == q.shape
        got = lse_to_lcab(lse, torch_varlen.LSE_LAYOUT, 4, S)
        assert got.shape == (4, S)


# ----------------------------------------------------------------------------- merged statistics
def unclaimed_block(mask: AttnMask, world: int) -> AttnMask | None:
    """The first ring block the adapter refuses (None: it claims them all)."""
    blocks = (mask.restrict(qs, ks) for qs, ks in ring_blocks(mask, world))
    return next((block for block in blocks if not claimed(block)), None)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(4)
@given(data=st.data())
def test_cpu_contract_ring_backward_from_merged_statistics(name, world, data):
    """Every mask pattern under ring attention at world 2 and 4: torch's backward op (stand-in
    from its row) driven by the merged statistics gives the fp64 reference's dq, dk, dv of the
    whole mask — or a block is refused with a reason."""
    mask = data.draw(pattern_masks(name, max_seqlen=90))
    assume(mask.seqlen_q >= world)
    refused = unclaimed_block(mask, world)
    if refused is not None:
        check_call(refused)  # refused with a varlen / alignment reason
        return
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, seed=data.draw(st.integers(0, 99)))
    CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, torch_varlen.MODULE, STANDIN)
        out, lse, grads = ring_forward_backward(
            get_kernel("torch_varlen"), mask, q, k, v, dout, world
        )
    assert sum(c.get("fn") == "backward" for c in CALLS) == world * world
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    for got, want, label in zip(grads, ref_grads, "qkv", strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{label}")


@pytest.mark.parametrize("name", ["causal_document", "sliding_window_causal"])
def test_stats_backward_calls_torchs_own_backward_op_on_meta(name):
    """The call fits the real ``torch_attn::_varlen_attn_backward`` (its schema and fake
    kernel), with the merged LSE in lcab's (Hq, Sq) = torch's (H_q, T_q)."""
    mask, meta = META_CASES[name], torch.device("meta")
    problem = Problem(S, S, 6, 2, 64, torch.bfloat16, meta)
    prepared = get_kernel("torch_varlen").prepare(mask, problem)
    q, dout, out = (torch.empty(S, 6, 64, dtype=torch.bfloat16, device=meta) for _ in "qdo")
    k, v = (torch.empty(S, 2, 64, dtype=torch.bfloat16, device=meta) for _ in "kv")
    lse = torch.empty(6, S, dtype=torch.float32, device=meta)
    dq, dk, dv = prepared.backward(dout, q, k, v, out, lse)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert get_kernel("torch_varlen").caps.stats_backward
