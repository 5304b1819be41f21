"""torch_varlen: CPU contract tests of lcab's call into ``torch.nn.attention.varlen`` (no GPU).

torch's ``varlen_attn`` runs only on CUDA, so a stand-in of its documented contract — packed
(T, H, D) inputs, cu_seq_q/cu_seq_k, ``window_size`` with (-1, 0) = causal, ``enable_gqa``,
LSE (T_q, H_q) in natural log with ``return_aux=AuxRequest(lse=True)`` — computes in plain
torch, and the adapter's whole path is compared with lcab's fp64 reference. The emulated call
mask must equal ``AttnMask.to_dense()`` for every mask the adapter claims.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.kernels import Problem, get_kernel, torch_varlen
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import lowering_reason
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted
from tests.helpers.standin_flash_attn import _attend, varlen_allowed

CALLS: list[dict] = []


@dataclass
class AuxRequest:
    lse: bool = False


def varlen_attn(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
    window_size=(-1, -1), enable_gqa=False,
):  # fmt: skip
    """The documented contract, in plain torch (causal = window (-1, 0))."""
    assert query.dim() == 3 and cu_seq_q.dtype == torch.int32 and isinstance(max_q, int)
    assert enable_gqa == (query.shape[1] != key.shape[1])
    CALLS.append({"cu_q": cu_seq_q, "cu_k": cu_seq_k, "window_size": window_size})
    allowed = varlen_allowed(cu_seq_q, cu_seq_k, False, window_size)
    out, lse, empty = _attend(query, key, value, allowed, scale)
    lse = lse.masked_fill(empty[None, :], float("inf"))  # what lcab must not rely on
    return (out, lse.t().contiguous()) if return_aux is not None and return_aux.lse else out


STANDIN = types.SimpleNamespace(varlen_attn=varlen_attn, AuxRequest=AuxRequest)


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
    q = torch.randn(mask.seqlen_q, 2, 8, generator=gen)
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
