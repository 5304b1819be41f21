"""sparse_flashinfer adapter: CPU contract tests against a stand-in of FlashInfer's wrappers.

* lowering semantics: the adapter's recorded ``plan`` arguments, turned into a dense mask by an
  emulator of the documented BSR + element-mask and variable-block semantics
  (``tests/helpers/standin_flashinfer.py``), equal ``AttnMask.to_dense()`` (per head) for every
  mask the adapter claims; per-head masks it cannot make of whole tiles are refused;
* contract: the whole path (padding to whole blocks, layouts, GQA, log2 LSE in (M, Hq) or
  (Hq, S) → natural-log (Hq, Sq), empty rows) on the stand-in in float64, against lcab's fp64
  reference: out and lse;
* forward only: backward cells refused with FlashInfer's reason;
* the version probe: old version, missing keyword, missing package.

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

from lcab.kernels import Problem, get_kernel, packages
from lcab.kernels import flashinfer as sparse_flashinfer
from lcab.kernels.flashinfer_lowering import refine
from lcab.kernels.upstream import flashinfer as fi_table
from lcab.masks import AttnMask, make_mask
from tests.helpers import standin_flashinfer as standin
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted, slice_masks

NAME = "sparse_flashinfer"
CUDA = torch.device("cuda")


def install(mp: pytest.MonkeyPatch, **overrides) -> None:
    mp.setitem(sys.modules, "flashinfer", standin.module(**overrides))


def run_adapter(mask: AttnMask, q, k, v, block_size: int = 16):
    """prepare + run as the benchmark does, on a CPU float problem (test-only bypass)."""
    prepared = get_kernel(NAME, block_size=block_size).prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared.from_native(out), lse


# ----------------------------------------------------------------------------- (a) semantics
def emulated_mask(call: dict, seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """(H, Sq, Sk) mask a recorded plan applies; BSR padding must attend no real row's key."""
    if call["wrapper"] == "variable":
        return standin.variable_allowed(
            call["block_mask_map"], call["block_row_sz"], call["block_col_sz"]
        ).numpy()
    dense = standin.bsr_allowed(
        call["indptr"], call["indices"], call["M"], call["N"], call["R"], call["C"], call["mask"],
        call["causal"],
    )  # fmt: skip
    assert not (call["causal"] and call["mask"] is not None)
    assert call["M"] % call["R"] == 0 and call["N"] % call["C"] == 0
    assert not dense[:seqlen_q, seqlen_k:].any(), "a real row attends a padded key"
    return dense[:seqlen_q, :seqlen_k].numpy()[None]


def rectangular(mask: AttnMask) -> bool:
    """Whether every slice is a fully attended rectangle (from the dense mask, per slice)."""
    d = dense3(mask)
    heads = np.repeat(np.arange(mask.num_heads), np.diff(mask.head_ptr))
    return all(
        d[h, q0:q1, k0:k1].all() for h, (q0, q1, k0, k1, _) in zip(heads, mask.slices, strict=True)
    )


def check_lowered_call(mask: AttnMask, block_size: int) -> None:
    kv_heads = mask.num_heads
    problem = Problem(*mask.shape, 2 * kv_heads, kv_heads, 64, torch.bfloat16, CUDA)
    reasons = get_kernel(NAME, block_size=block_size).not_supported_reasons(problem, mask)
    refused = [r for r in reasons if r.startswith("per-KV-head mask not expressible")]
    # independent expectation: shared masks always (element masks); per-head masks made of
    # whole rectangles always; other per-head masks may be refused (or claimed, then exact)
    if mask.num_heads == 1 or rectangular(mask):
        assert not refused, reasons
    if refused:
        return
    assert not any("element mask" in r for r in reasons)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, 2 * kv_heads, 8, generator=gen)
    k, v = (torch.randn(mask.seqlen_k, kv_heads, 8, generator=gen) for _ in range(2))
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp)
        run_adapter(mask, q, k, v, block_size)
    plans = [c for c in standin.CALLS if "run" not in c]
    want = dense3(mask)
    if not want.any():  # nothing attended: the adapter must not call plan (nnz = 0 fails there)
        assert plans == []
        return
    (call,) = plans
    assert call["wrapper"] == ("bsr" if mask.num_heads == 1 else "variable")
    got = emulated_mask(call, *mask.shape)
    if not np.array_equal(got, want):
        bad = tuple(np.argwhere(got != want)[0].tolist())
        raise AssertionError(f"{mask!r}: plan gives {got[bad]} at {bad}")


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_cpu_contract_emulated_plan_equals_dense_mask(name, data) -> None:
    block = data.draw(st.sampled_from([4, 16, 32]))
    check_lowered_call(data.draw(pattern_masks(name, 120)), block)


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(6)
@given(data=st.data())
def test_cpu_contract_emulated_plan_equals_dense_mask_cp_rectangles(name, data) -> None:
    block = data.draw(st.sampled_from([8, 16]))
    check_lowered_call(data.draw(restricted(name, 120)), block)


@fast(40)
@given(mask=slice_masks(max_len=60, max_heads=3))
def test_cpu_contract_random_slices_claimed_exactly_or_refused(mask) -> None:
    """Per-head masks with causal bands are refused unless their tiles are all whole."""
    check_lowered_call(mask, 8)


@fast(40)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    extra=st.integers(0, 20),
)
def test_refine_splits_blocks_without_empty_ones(sizes, extra) -> None:
    edges = np.concatenate([[0], np.cumsum(sizes)])
    count = min(len(sizes) + extra, int(edges[-1]))
    fine, owner = refine(edges, count)
    assert len(fine) == count + 1 and (np.diff(fine) > 0).all()
    assert set(edges.tolist()) <= set(fine.tolist())  # a refinement: old edges kept
    assert (edges[owner] <= fine[:-1]).all() and (fine[1:] <= edges[owner + 1]).all()


# ----------------------------------------------------------------------------- (b) contract
S = 96
DOCS = {"doc_source": "uniform", "min_doc_len": 7, "max_doc_len": 40}
CASES = {
    # (mask, block size, BSR form: plain (whole tiles), causal flag, element mask)
    "full": (make_mask("full", S), 32, "plain"),
    "causal": (make_mask("causal", S), 32, "causal"),  # diagonal tiles: FlashInfer's flag
    "causal_document": (make_mask("causal_document", S, seed=2, **DOCS), 16, "element"),
    "sliding_window": (make_mask("sliding_window", S, window=13), 16, "element"),
    # S = 90: not a multiple of the block: padded keys masked, padded rows dropped
    "full_not_multiple": (make_mask("full", 90), 32, "element"),
    "causal_not_multiple": (make_mask("causal", 90), 32, "causal"),
    "block_sparse_shared": (make_mask("block_sparse", S, block_size=16, seed=3), 16, "plain"),
    # a CP rectangle with rows attending nothing (out 0, lse -inf from the mask)
    "causal_empty_rows": (make_mask("causal", S).restrict((0, S), (30, S)), 16, "element"),
    "causal_rect": (make_mask("causal", S).restrict((32, S), (0, S)), 16, "causal"),
    "causal_rect_offset": (make_mask("causal", S).restrict((40, S), (0, 70)), 16, "element"),
    # r + 1 keys per row, but the last ones of the tile, not the first: not the causal flag
    "anti_diagonal": (
        AttnMask.from_dense(np.add.outer(np.arange(32), np.arange(32)) >= 31),
        16,
        "element",
    ),
}
PER_HEAD = {
    "block_sparse_heads": make_mask("block_sparse", S, block_size=16, heads=2, seed=4),
    "block_sparse_heads_90": make_mask("block_sparse", 90, block_size=32, heads=2, seed=6),
    "varblock_heads": make_mask(
        "varblock_sparse", S, avg_block_size=20, min_block_size=8, heads=2, seed=5
    ),
    "varblock_empty_rows": make_mask(
        "varblock_sparse", S, avg_block_size=20, min_block_size=8, density=0.2, heads=2, seed=1
    ),
}


def tensors(mask: AttnMask, hq: int, hkv: int, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(11)
    sq, sk = mask.shape
    q = torch.randn(sq, hq, 16, generator=gen, dtype=dtype)
    k = torch.randn(sk, hkv, 16, generator=gen, dtype=dtype)
    v = torch.randn(sk, hkv, 16, generator=gen, dtype=dtype)
    return q, k, v


def check_against_reference(mask: AttnMask, out, lse, q, k, v) -> None:
    ref_out, ref_lse = get_kernel("reference")(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[1], mask.seqlen_q) and lse.dtype == ref_lse.dtype
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isnan(lse).any() and not torch.isposinf(lse).any()
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_contract_bsr_matches_fp64_reference(case, heads, monkeypatch) -> None:
    mask, block, form = CASES[case]
    install(monkeypatch)
    q, k, v = tensors(mask, *heads)
    standin.CALLS.clear()
    out, lse = run_adapter(mask, q, k, v, block)
    plan, run = standin.CALLS
    assert plan["wrapper"] == "bsr" and (plan["mask"] is not None) == (form == "element")
    assert plan["causal"] == (form == "causal")
    assert plan["R"] == plan["C"] == block and plan["sm_scale"] == 16**-0.5
    assert plan["M"] == -(-mask.seqlen_q // block) * block
    assert run["lse"].shape == (plan["M"], heads[0])  # the library's (M, Hq) layout
    check_against_reference(mask, out, lse, q, k, v)


@pytest.mark.parametrize("heads", [(4, 2), (6, 2)], ids=["mha_per_kv_head", "gqa"])
@pytest.mark.parametrize("case", list(PER_HEAD))
def test_cpu_contract_variable_blocks_match_fp64_reference(case, heads, monkeypatch) -> None:
    mask = PER_HEAD[case]
    install(monkeypatch)
    q, k, v = tensors(mask, *heads)
    standin.CALLS.clear()
    out, lse = run_adapter(mask, q, k, v)
    plan, run = standin.CALLS
    assert plan["wrapper"] == "variable" and plan["block_mask_map"].shape[0] == 2
    assert run["lse"].shape == (heads[0], mask.seqlen_q)  # the library's (Hq, S) layout
    check_against_reference(mask, out, lse, q, k, v)


def test_cpu_contract_lse_is_converted_from_log2(monkeypatch) -> None:
    """The raw LSE is base 2: the adapter's is ln 2 times it (not a copy, not a transpose)."""
    mask = make_mask("full", 64)
    install(monkeypatch)
    q, k, v = tensors(mask, 3, 1, torch.float32)
    standin.CALLS.clear()
    _, lse = run_adapter(mask, q, k, v)
    raw = standin.CALLS[-1]["lse"]
    assert raw.shape == (64, 3) and raw.dtype == torch.float32
    torch.testing.assert_close(lse, raw.t() * np.log(2.0))


def test_cpu_contract_nothing_attended_calls_no_plan(monkeypatch) -> None:
    mask = make_mask("causal", 64).restrict((0, 16), (32, 64))  # above the diagonal: empty
    install(monkeypatch)
    q, k, v = tensors(mask, 2, 1)
    standin.CALLS.clear()
    out, lse = run_adapter(mask, q, k, v)
    assert standin.CALLS == [] and torch.all(out == 0) and torch.isneginf(lse).all()


def test_cpu_contract_prepare_imports_lazily_and_names_the_package() -> None:
    assert "flashinfer" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="flashinfer"):
        get_kernel(NAME).prepare(make_mask("causal", 8), Problem(8, 8, 1, 1, 8))


# ----------------------------------------------------------------------------- reasons
CUDA_BF16 = Problem(256, 256, 8, 2, 64, torch.bfloat16, CUDA)


@pytest.mark.parametrize("pass_", ["bwd", "fwd_bwd"])
def test_backward_refused_with_flashinfers_reason(pass_) -> None:
    reasons = get_kernel(NAME).not_supported_reasons(CUDA_BF16, make_mask("causal", 256), pass_)
    assert reasons[0] == "FlashInfer has no backward pass (forward-only kernels, no autograd)"
    assert not any(r.startswith("no backward pass") for r in reasons)
    fwd = get_kernel(NAME).not_supported_reasons(CUDA_BF16, make_mask("causal", 256), "fwd")
    assert not any("backward" in r for r in fwd)


def test_per_head_mask_with_other_head_count_and_causal_bands_refused() -> None:
    two_heads = make_mask("block_sparse", 256, block_size=32, heads=2, seed=0)
    four_kv = Problem(256, 256, 8, 4, 64, torch.bfloat16, CUDA)
    assert "mask has 2 heads, the problem 4 KV heads" in get_kernel(NAME).not_supported_reasons(
        four_kv, two_heads
    )
    causal = make_mask("causal", 64)
    heads = AttnMask(
        np.concatenate([causal.slices, causal.slices]), 64, 64, head_ptr=np.array([0, 1, 2])
    )
    two_kv = Problem(64, 64, 4, 2, 64, torch.bfloat16, CUDA)
    (why,) = [r for r in get_kernel(NAME).not_supported_reasons(two_kv, heads) if "per-KV" in r]
    assert "partly attended tiles" in why and "no element mask" in why


def test_element_mask_too_large_is_a_reason(monkeypatch) -> None:
    from lcab.kernels import flashinfer as adapter

    monkeypatch.setattr(adapter, "ELEMENT_MASK_LIMIT", 1000)
    kernel = get_kernel(NAME, block_size=16)
    partial = kernel.not_supported_reasons(CUDA_BF16, make_mask("sliding_window", 256, window=9))
    assert any("element mask" in r for r in partial)
    causal = make_mask("causal", 256)  # diagonal tiles: the causal flag, no element mask
    assert not any("element mask" in r for r in kernel.not_supported_reasons(CUDA_BF16, causal))
    whole_tiles = make_mask("block_sparse", 256, block_size=16, seed=1)  # no mask needed
    assert not any(
        "element mask" in r for r in kernel.not_supported_reasons(CUDA_BF16, whole_tiles)
    )


def test_reasons_on_this_machine_name_cuda_and_the_package() -> None:
    k = get_kernel(NAME)
    assert k.caps.returns_lse and not k.caps.backward_devices and k.caps.per_head_masks
    for problem in (CUDA_BF16, Problem(256, 256, 8, 2, 64)):
        text = " ".join(k.not_supported_reasons(problem))
        assert "CUDA" in text and "flashinfer" in text and "lcab[flashinfer]" in text


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Pretend CUDA is present, so the probe's import-time checks run (they need it)."""
    monkeypatch.setattr(packages, "cuda_present", lambda: True)
    return monkeypatch


def version(mp: pytest.MonkeyPatch, found: str | None) -> None:
    mp.setattr(packages, "distribution_version", lambda names: found)


def test_probe_accepts_the_documented_api(on_cuda) -> None:
    install(on_cuda)
    version(on_cuda, "0.7.2.post1")
    assert get_kernel(NAME).package_reasons(CUDA) == []


def test_probe_reads_the_flashinfer_python_distribution() -> None:
    assert get_kernel(NAME).caps.requires.distributions[0] == "flashinfer-python"


def test_probe_old_version_alone_is_a_reason(monkeypatch) -> None:
    version(monkeypatch, "0.2.5")
    reasons = get_kernel(NAME).not_supported_reasons(CUDA_BF16)
    assert (
        "flashinfer 0.2.5 is older than lcab's adapter supports "
        "(lcab needs >= 0.2.7 (VariableBlockSparseAttentionWrapper))" in reasons
    )


def test_probe_missing_keyword_and_missing_wrapper(on_cuda) -> None:
    install(on_cuda, BlockSparseAttentionWrapper=standin.OldBlockSparseAttentionWrapper)
    version(on_cuda, "0.2.3")
    (reason,) = get_kernel(NAME).package_reasons(CUDA)
    assert reason.startswith(
        "flashinfer 0.2.3 has no return_lse in BlockSparseAttentionWrapper.run"
    )
    mod = standin.module()
    del mod.VariableBlockSparseAttentionWrapper
    on_cuda.setitem(sys.modules, "flashinfer", mod)
    version(on_cuda, None)
    reasons = get_kernel(NAME).package_reasons(CUDA)
    assert reasons[0].startswith(
        "flashinfer (version unknown) has no VariableBlockSparseAttentionWrapper"
    )


def test_probe_skips_import_checks_without_cuda(monkeypatch) -> None:
    install(monkeypatch, BlockSparseAttentionWrapper=standin.OldBlockSparseAttentionWrapper)
    version(monkeypatch, "0.7.2")
    assert get_kernel(NAME).package_reasons(torch.device("cpu")) == []
    monkeypatch.setattr(packages, "cuda_present", lambda: False)
    assert get_kernel(NAME).package_reasons(CUDA) == []


# ----------------------------------------------------------------------------- upstream rows
def test_standin_wrappers_have_the_rows_signatures() -> None:
    """Constructors, plan and run accept exactly what the 0.7.2.post1 wheel's do."""
    for cls, init, plan, run in (
        (standin.BlockSparseAttentionWrapper, fi_table.BSR_INIT, fi_table.BSR_PLAN,
         fi_table.BSR_RUN),
        (standin.VariableBlockSparseAttentionWrapper, fi_table.VARIABLE_INIT,
         fi_table.VARIABLE_PLAN, fi_table.VARIABLE_RUN),
    ):  # fmt: skip
        assert inspect.signature(cls) == init.signature()
        assert inspect.signature(cls.plan) == plan.signature()
        assert inspect.signature(cls.run) == run.signature()
    wrapper = standin.VariableBlockSparseAttentionWrapper(torch.empty(8, dtype=torch.uint8))
    with pytest.raises(TypeError, match="o_data_type"):  # the BSR plan's keyword only
        wrapper.plan(None, None, None, 1, 1, 64, o_data_type=torch.float16)


def test_lse_conversion_follows_the_table() -> None:
    """log2 → natural log, and each wrapper's layout, as the table states them."""
    factors = {"bsr": sparse_flashinfer.BSR_LSE, "variable": sparse_flashinfer.VARIABLE_LSE}
    assert {name: layout for name, (_, layout) in factors.items()} == {
        "bsr": "th",
        "variable": "ht",
    }
    assert all(f == pytest.approx(0.693147180559) for f, _ in factors.values())
