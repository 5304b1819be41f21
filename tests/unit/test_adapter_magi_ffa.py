"""ffa adapter: CPU contract tests against a stand-in of MagiAttention v1.1's FFA (no GPU).

* lowering semantics: the adapter's recorded ``q_ranges``/``k_ranges``/``attn_type_map``, turned
  into a dense mask by an emulator of FFA's documented kinds (``tests/helpers/standin_magi_ffa``),
  equal ``AttnMask.to_dense()`` — every registered pattern, CP rectangles of them, and random
  slices of all four kinds with m != n — and no (row, key) pair is covered twice;
* contract: the adapter's whole path (range tensors, GQA, LSE (total_q, Hq) → (Hq, Sq), empty
  rows, autograd) on the stand-in computing in float64, against lcab's fp64 reference kernel:
  out, lse, dq, dk, dv;
* the version probe: the PyPI placeholder, an API needing max_seqlen_q/k, a non-Hopper GPU.

The tests call ``Kernel.prepare`` directly with a CPU float problem (``not_supported_reasons``
would refuse it, as it should).
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
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import lowering_reason
from tests.helpers import standin_magi_ffa as standin
from tests.helpers.contract import forward_backward, tensors
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted, slice_masks


def install(mp: pytest.MonkeyPatch, **overrides) -> None:
    for name, mod in standin.modules(**overrides).items():
        mp.setitem(sys.modules, name, mod)


def run_adapter(mask: AttnMask, q, k, v):
    """prepare + run, as the benchmark does, on a CPU float problem (test-only bypass)."""
    prepared = get_kernel("ffa").prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared.from_native(out), lse


# ----------------------------------------------------------------------------- (a) semantics
def check_lowered_call(mask: AttnMask) -> None:
    problem = Problem(*mask.shape, 2, 1, 64, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("ffa").not_supported_reasons(problem, mask)
    claimed = lowering_reason(mask, "ffa") is None
    assert claimed == (mask.num_heads == 1), "FFA claims every head-shared mask"
    if not claimed:
        assert any(r.startswith("no per-KV-head masks") for r in reasons), reasons
        return
    assert not any("not expressible" in r for r in reasons)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, 2, 8, generator=gen)
    k, v = (torch.randn(mask.seqlen_k, 1, 8, generator=gen) for _ in range(2))
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp)
        run_adapter(mask, q, k, v)
    if mask.num_slices == 0:  # nothing attended: no call
        assert standin.CALLS == []
        return
    (call,) = standin.CALLS
    got = standin.allowed_of_call(call, *mask.shape).numpy()
    want = dense3(mask)[0]
    if not np.array_equal(got, want):
        bad = tuple(np.argwhere(got != want)[0].tolist())
        raise AssertionError(f"{mask!r}: the call gives {got[bad]} at {bad}")


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(15)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask(name, data) -> None:
    check_lowered_call(data.draw(pattern_masks(name)))


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask_cp_rectangles(name, data) -> None:
    check_lowered_call(data.draw(restricted(name)))


@fast(60)
@given(mask=slice_masks(max_heads=2))
def test_cpu_contract_emulated_call_mask_random_slices_of_every_kind(mask) -> None:
    """inv_causal and bi_causal on m != n rectangles: the alignments of FFA's codes 2 and 3."""
    check_lowered_call(mask)


# ----------------------------------------------------------------------------- (b) contract
S = 96
DOCS = {"doc_source": "uniform", "min_doc_len": 7, "max_doc_len": 40}
KINDS = AttnMask(  # every kind, m != n, two slices sharing query rows, a row with no key
    np.array(
        [
            [0, 20, 0, 30, 2],  # inv_causal, 20 x 30
            [0, 20, 40, 50, 0],  # full, same rows
            [30, 60, 10, 50, 3],  # bi_causal, 30 x 40
            [60, 90, 0, 20, 1],  # causal, 30 x 20 (rows 60..69 see nothing)
            [70, 96, 60, 96, 1],
        ]
    ),
    S,
)
CASES = {
    "causal": make_mask("causal", S),
    "sliding_window": make_mask("sliding_window", S, window=13),
    "causal_document": make_mask("causal_document", S, seed=2, **DOCS),
    "share_question": make_mask("share_question", S, seed=3),
    "prefix_lm_document": make_mask("prefix_lm_document", S, seed=4),
    "causal_rect": make_mask("causal", S).restrict((40, S), (0, 70)),
    "causal_empty_rows": make_mask("causal", S).restrict((0, S), (30, S)),
    "kinds": KINDS,
}


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_contract_adapter_matches_fp64_reference(case, heads, monkeypatch) -> None:
    mask = CASES[case]
    install(monkeypatch)
    q, k, v, dout = tensors(mask, *heads, torch.float64)
    standin.CALLS.clear()
    out, lse, grads = forward_backward(lambda *t: run_adapter(mask, *t), q, k, v, dout)
    assert len(standin.CALLS) == 1
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


@pytest.mark.parametrize("raw_empty", [float("-inf"), float("nan"), 0.0])
def test_cpu_contract_float32_and_empty_rows_whatever_ffa_reports(raw_empty, monkeypatch):
    """FFA's LSE on rows attending nothing is undocumented: lcab's -inf / out 0 regardless."""
    mask = CASES["causal_empty_rows"]
    install(monkeypatch)
    monkeypatch.setitem(standin.EMPTY_LSE, "value", raw_empty)
    q, k, v, _ = tensors(mask, 4, 2, torch.float32)
    standin.CALLS.clear()
    out, lse = run_adapter(mask, q, k, v)
    raw = standin.CALLS[0]["lse"]
    assert raw.shape == (S, 4) and raw.dtype == torch.float32  # (total_q, Hq), float32
    assert torch.isneginf(lse[:, :30]).all() and torch.isfinite(lse[:, 30:]).all()
    assert torch.all(out[:30] == 0) and lse.dtype == torch.float32
    ref_out, ref_lse = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse[:, 30:].double(), ref_lse[:, 30:], rtol=1e-5, atol=1e-5)


def test_cpu_contract_a_bare_lse_tensor_is_refused(monkeypatch) -> None:
    """The pre-v1.1 return (out, lse) is an error with the reason, not a guessed layout."""
    install(monkeypatch, flex_flash_attn_func=standin.returning_lse_tensor)
    q, k, v, _ = tensors(CASES["causal"], 2, 2, torch.float32)
    with pytest.raises(RuntimeError, match="without an lse tensor"):
        run_adapter(CASES["causal"], q, k, v)


def test_cpu_contract_prepare_imports_lazily_and_names_the_package() -> None:
    assert "magi_attention" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="magi_attention"):
        get_kernel("ffa").prepare(make_mask("causal", 8), Problem(8, 8, 1, 1, 8))


def test_lse_to_lcab_token_major_layout() -> None:
    lse = torch.arange(12.0).reshape(3, 4)  # (H, S)
    assert torch.equal(lse_to_lcab(lse.t(), "th", 3, 4), lse)
    with pytest.raises(RuntimeError, match="documented th layout"):
        lse_to_lcab(lse, "th", 3, 4)


# ----------------------------------------------------------------------------- probe
CUDA_BF16 = Problem(256, 256, 8, 2, 128, torch.bfloat16, torch.device("cuda"))


def test_reasons_on_this_machine_name_cuda_and_the_package() -> None:
    k = get_kernel("ffa")
    assert k.caps.returns_lse and k.caps.stats_backward
    for problem in (CUDA_BF16, Problem(256, 256, 8, 2, 128)):
        text = " ".join(k.not_supported_reasons(problem))
        assert "CUDA" in text and "magi_attention" in text
    assert "head_dim 96 not in [64, 128]" in k.not_supported_reasons(
        Problem(256, 256, 8, 2, 96, torch.bfloat16, torch.device("cuda"))
    )


@pytest.fixture
def on_hopper(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Pretend CUDA (sm90) is present, so the probe's import-time checks run (they need it)."""
    monkeypatch.setattr(packages, "cuda_present", lambda: True)
    monkeypatch.setattr("lcab.kernels.magi_ffa.cuda_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return monkeypatch


def version(mp: pytest.MonkeyPatch, found: str | None) -> None:
    mp.setattr(packages, "distribution_version", lambda names: found)


def test_probe_accepts_the_documented_api(on_hopper) -> None:
    install(on_hopper)
    version(on_hopper, "1.1.1")
    assert get_kernel("ffa").extra_reasons(CUDA_BF16, "fwd_bwd") == []


def test_probe_pypi_placeholder_is_too_old(monkeypatch) -> None:
    version(monkeypatch, "0.0.1")
    (reason,) = get_kernel("ffa").package_reasons(CUDA_BF16.device)
    assert reason.startswith("magi_attention.functional 0.0.1 is older than lcab's adapter")
    assert "empty placeholder" in reason


def test_probe_refuses_the_api_needing_max_seqlen(on_hopper) -> None:
    install(on_hopper, flex_flash_attn_func=standin.flex_flash_attn_func_before_v1_1)
    version(on_hopper, "1.0.4")
    (reason,) = get_kernel("ffa").package_reasons(CUDA_BF16.device)
    assert reason.startswith(
        "magi_attention.functional 1.0.4's flex_flash_attn_func requires max_seqlen_q, "
        "max_seqlen_k, which lcab's adapter does not pass"
    )


def test_non_hopper_gpu_is_a_reason(on_hopper) -> None:
    install(on_hopper)
    version(on_hopper, "1.1.1")
    on_hopper.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    (reason,) = get_kernel("ffa").extra_reasons(CUDA_BF16, "fwd")
    assert reason.startswith("native FFA runs on sm90 only (this GPU is sm_100")
