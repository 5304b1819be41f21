"""sparse_fa2 adapter: CPU contract tests against a stand-in of Block-Sparse-Attention (no GPU).

* lowering semantics: the adapter's recorded call, turned into a dense mask per query head by an
  emulator of the library's documented block semantics (``tests/helpers/
  standin_block_sparse_attn.py``), equals ``AttnMask.to_dense()`` (expanded from KV heads to
  query heads) for every mask the adapter claims — ``block_sparse`` with ``block_size=128`` at
  lengths whose last block is short, ``full``, masks of whole tiles given densely, 128-aligned
  CP rectangles — and every other mask is refused with the partial-tile reason;
* contract: the adapter's whole path (block mask per query head, GQA/MQA, LSE (1, Hq, S) →
  (Hq, S), the library's +inf empty rows → -inf, autograd) on the stand-in computing in float64,
  against lcab's fp64 reference kernel: out, lse, dq, dk, dv;
* the version probe: an old version (metadata or ``__version__``) or a missing keyword gives the
  precise skipped reason; without the package the reason names it.

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
from lcab.kernels.block_grid import partial_tile_reason
from lcab.kernels.block_sparse_attn import aligned_full_slices, kept_blocks
from lcab.kernels.upstream import block_sparse_attn as bsa_table
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering.blocks import block_table
from tests.helpers import standin_block_sparse_attn as standin
from tests.helpers.contract import forward_backward, tensors
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, from_dense, pattern_masks, restricted

KERNEL = "sparse_fa2"
REFUSAL = "mask not expressible as 128x128 blocks: "


def install(mp: pytest.MonkeyPatch, **overrides) -> None:
    mp.setitem(sys.modules, "block_sparse_attn", standin.bsa_module(**overrides))


def run_adapter(mask: AttnMask, q, k, v):
    """prepare + run, as the benchmark does, on a CPU float problem (test-only bypass)."""
    prepared = get_kernel(KERNEL).prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared.from_native(out), lse


def per_query_head(mask: AttnMask, heads_q: int) -> np.ndarray:
    """``mask.to_dense()`` as (Hq, Sq, Sk): KV head h's mask for each query head of its group."""
    dense = dense3(mask)
    return np.repeat(dense, heads_q // dense.shape[0], axis=0)


# ----------------------------------------------------------------------------- (a) semantics
def check_lowered_call(mask: AttnMask, must_claim: bool = False) -> bool:
    """Claimed → the emulated call equals the dense mask; refused → the partial-tile reason."""
    heads_kv = mask.num_heads
    heads_q = 2 * heads_kv
    problem = Problem(*mask.shape, heads_q, heads_kv, 64, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel(KERNEL).not_supported_reasons(problem, mask)
    exact = partial_tile_reason(mask, 128, 128) is None  # independent of the adapter's fast path
    refused = [r for r in reasons if r.startswith(REFUSAL)]
    assert exact or not must_claim, f"{mask!r} should be claimed"
    assert bool(refused) != exact, reasons
    if not exact:
        assert "partly attended" in refused[0] and "block_size=128" in refused[0]
        return False
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, heads_q, 8, generator=gen)
    k, v = (torch.randn(mask.seqlen_k, heads_kv, 8, generator=gen) for _ in range(2))
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp)
        run_adapter(mask, q, k, v)
    (call,) = standin.CALLS
    assert call["head_types"].tolist() == list(range(1, heads_q + 1))  # renumbered per head
    got = standin.allowed_of_call(call).numpy()
    want = per_query_head(mask, heads_q)
    if not np.array_equal(got, want):
        bad = tuple(np.argwhere(got != want)[0].tolist())
        raise AssertionError(f"{mask!r}: the call gives {got[bad]} at (head, q, k) = {bad}")
    return True


@fast(25)
@given(
    seqlen=st.integers(1, 700),
    density=st.integers(1, 100),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_cpu_contract_block_sparse_128_is_claimed_and_exact(seqlen, density, heads, seed) -> None:
    mask = make_mask(
        "block_sparse", seqlen, seed=seed, block_size=128, density=density / 100, heads=heads
    )
    check_lowered_call(mask, must_claim=True)


@pytest.mark.parametrize("seqlen", [1, 127, 128, 300, 513, 700])
def test_cpu_contract_full_is_claimed_and_exact(seqlen) -> None:
    check_lowered_call(make_mask("full", seqlen), must_claim=True)


@st.composite
def whole_tile_masks(draw: st.DrawFn) -> AttnMask:
    """Arbitrary 128x128 tile patterns given densely (slices not on the grid: block-table path)."""
    sq, sk = draw(st.integers(1, 520)), draw(st.integers(1, 520))
    heads = draw(st.integers(1, 2))
    nq, nk = -(-sq // 128), -(-sk // 128)
    bits = draw(st.lists(st.booleans(), min_size=heads * nq * nk, max_size=heads * nq * nk))
    tiles = np.array(bits, dtype=bool).reshape(heads, nq, nk)
    dense = tiles.repeat(128, axis=1).repeat(128, axis=2)[:, :sq, :sk]
    return from_dense(dense)


@fast(20)
@given(mask=whole_tile_masks())
def test_cpu_contract_masks_of_whole_tiles_are_claimed_and_exact(mask) -> None:
    """Includes empty query blocks (rows attending nothing) and Sq != Sk."""
    check_lowered_call(mask, must_claim=True)


@fast(15)
@given(data=st.data())
def test_cpu_contract_aligned_cp_rectangles_of_block_sparse(data) -> None:
    mask = make_mask("block_sparse", 640, seed=data.draw(st.integers(0, 99)), block_size=128)
    q0, k0 = data.draw(st.integers(0, 4)) * 128, data.draw(st.integers(0, 4)) * 128
    q1, k1 = data.draw(st.integers(q0 + 1, 640)), data.draw(st.integers(k0 + 1, 640))
    sub = mask.restrict((q0, q1), (k0, k1))
    # starts on the grid: the rectangle's own grid is the original one, cut at its end
    check_lowered_call(sub, must_claim=True)


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(10)
@given(data=st.data())
def test_cpu_contract_every_pattern_claimed_iff_whole_tiles(name, data) -> None:
    check_lowered_call(data.draw(pattern_masks(name, max_seqlen=400)))


@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(6)
@given(data=st.data())
def test_cpu_contract_every_pattern_cp_rectangle_claimed_iff_whole_tiles(name, data) -> None:
    check_lowered_call(data.draw(restricted(name, max_seqlen=400)))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("causal", {}),
        ("causal_document", {}),
        ("full_document", {}),
        ("sliding_window", {"window": 200}),
        ("block_sparse", {"block_size": 64}),
        ("varblock_sparse", {"avg_block_size": 150, "min_block_size": 100}),
        ("block_sparse", {"block_size": 100}),
    ],
)
def test_cpu_contract_partial_tile_masks_are_refused(name, params) -> None:
    assert not check_lowered_call(make_mask(name, 700, seed=3, **params))


@fast(10)
@given(data=st.data())
def test_fast_path_agrees_with_the_block_table(data) -> None:
    """The O(slices) painting of aligned slices equals the block table's touched tiles."""
    mask = make_mask(
        "block_sparse",
        data.draw(st.integers(1, 900)),
        seed=data.draw(st.integers(0, 99)),
        block_size=128 * data.draw(st.integers(1, 2)),
        heads=data.draw(st.integers(1, 3)),
    )
    assert aligned_full_slices(mask)
    want = block_table(mask, 128, 128).dense_blocks() > 0
    assert torch.equal(kept_blocks(mask), want)


# ----------------------------------------------------------------------------- (b) contract
def bs(seqlen: int, heads: int, seed: int = 1, density: float = 0.4) -> AttnMask:
    return make_mask(
        "block_sparse", seqlen, seed=seed, block_size=128, density=density, heads=heads
    )


def empty_block_row_mask(seqlen: int, heads: int) -> AttnMask:
    """Whole tiles where query block 1 attends nothing (library LSE +inf there)."""
    nb = -(-seqlen // 128)
    tiles = np.tril(np.ones((nb, nb), dtype=bool))
    tiles[1] = False
    tiles = np.broadcast_to(tiles, (heads, nb, nb))
    return from_dense(tiles.repeat(128, axis=1).repeat(128, axis=2)[:, :seqlen, :seqlen])


HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (6, 1)}
CASES = {
    "block_sparse_300": lambda hkv: bs(300, hkv),
    "block_sparse_517": lambda hkv: bs(517, hkv, seed=4, density=0.7),
    "block_sparse_shared": lambda hkv: bs(400, 1, seed=5),  # one mask for every head
    "full_333": lambda hkv: make_mask("full", 333),
    "empty_block_row": lambda hkv: empty_block_row_mask(400, hkv),
    # a CP step: Sq != Sk, queries after the keys, 128-aligned offsets
    "cp_rectangle": lambda hkv: bs(640, hkv, seed=6).restrict((256, 640), (0, 384)),
}


@pytest.mark.parametrize("heads", list(HEADS.values()), ids=list(HEADS))
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_contract_adapter_matches_fp64_reference(case, heads, monkeypatch) -> None:
    hq, hkv = heads
    mask = CASES[case](hkv)
    install(monkeypatch)
    q, k, v, dout = tensors(mask, hq, hkv, torch.float64)
    standin.CALLS.clear()
    out, lse, grads = forward_backward(lambda *t: run_adapter(mask, *t), q, k, v, dout)
    assert len(standin.CALLS) == 1
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    assert out.shape == q.shape and out.dtype == torch.float64
    assert lse.shape == (hq, mask.seqlen_q) and lse.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isposinf(lse).any() and not torch.isnan(lse).any()
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


def test_cpu_contract_float32_raw_lse_layout_and_empty_rows(monkeypatch) -> None:
    """The library's (1, Hq, S) float32 LSE with +inf on empty rows → lcab's (Hq, S), -inf."""
    mask = empty_block_row_mask(400, 2)
    install(monkeypatch)
    q, k, v, _ = tensors(mask, 4, 2, torch.float32)
    standin.CALLS.clear()
    out, lse = run_adapter(mask, q, k, v)
    raw = standin.CALLS[0]["lse"]
    assert raw.shape == (1, 4, 400) and raw.dtype == torch.float32
    assert torch.isposinf(raw[0, :, 128:256]).all()
    assert torch.isneginf(lse[:, 128:256]).all() and torch.all(out[128:256] == 0)
    assert torch.isfinite(lse[:, :128]).all() and torch.isfinite(lse[:, 256:]).all()
    ref_out, ref_lse = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    keep = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[keep].double(), ref_lse[keep], rtol=1e-5, atol=1e-5)


def test_cpu_contract_lse_is_not_differentiable_so_no_stats_backward(monkeypatch) -> None:
    """The library ignores the LSE's gradient: the adapter detaches it and refuses merged bwd."""
    mask = bs(300, 2)
    install(monkeypatch)
    q, k, v, dout = tensors(mask, 4, 2, torch.float64)
    prepared = get_kernel(KERNEL).prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(q.requires_grad_(), k, v)
    assert out.requires_grad and not lse.requires_grad
    assert not get_kernel(KERNEL).caps.stats_backward
    with pytest.raises(NotImplementedError):
        prepared.backward(dout, q.detach(), k, v, out.detach(), lse)


def test_cpu_contract_prepare_imports_lazily_and_names_the_package() -> None:
    assert "block_sparse_attn" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="block_sparse_attn"):
        get_kernel(KERNEL).prepare(make_mask("full", 8), Problem(8, 8, 1, 1, 8))


# ----------------------------------------------------------------------------- (c) probe
CUDA_BF16 = Problem(384, 384, 8, 2, 64, torch.bfloat16, torch.device("cuda"))


def test_caps_and_static_reasons() -> None:
    kernel = get_kernel(KERNEL)
    caps = kernel.caps
    assert caps.lowering == "block_table" and caps.per_head_masks and caps.returns_lse
    assert caps.backward_devices == {"cuda"} and caps.min_compute_capability == (8, 0)
    for problem, words in [
        (Problem(384, 384, 8, 2, 96, torch.bfloat16, torch.device("cuda")), "head_dim 96"),
        (Problem(384, 384, 8, 2, 64, torch.float32, torch.device("cuda")), "dtype float32"),
        (Problem(384, 384, 8, 2, 64), "needs a CUDA GPU"),
    ]:
        assert any(words in r for r in kernel.not_supported_reasons(problem)), words
    mask = bs(384, 3)  # 3 mask heads for 2 KV heads
    reasons = kernel.not_supported_reasons(CUDA_BF16, mask)
    assert any("mask has 3 heads" in r for r in reasons)
    assert not any(r.startswith(REFUSAL) for r in reasons)


def test_reasons_on_this_machine_name_cuda_and_the_package() -> None:
    kernel = get_kernel(KERNEL)
    text = " ".join(kernel.not_supported_reasons(CUDA_BF16, bs(384, 2), "fwd_bwd"))
    assert "CUDA" in text and "block_sparse_attn" in text


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Pretend CUDA is present, so the probe's import-time checks run (they need it)."""
    monkeypatch.setattr(packages, "cuda_present", lambda: True)
    return monkeypatch


def version(mp: pytest.MonkeyPatch, found: str | None) -> None:
    mp.setattr(packages, "distribution_version", lambda names: found)


def test_probe_accepts_the_documented_api(on_cuda) -> None:
    install(on_cuda)
    version(on_cuda, "0.0.2")
    assert get_kernel(KERNEL).package_reasons(CUDA_BF16.device) == []
    version(on_cuda, None)  # no metadata: the module's __version__ 0.0.2 is read instead
    assert get_kernel(KERNEL).package_reasons(CUDA_BF16.device) == []


def test_probe_old_version_from_metadata(monkeypatch) -> None:
    version(monkeypatch, "0.0.1")
    reasons = get_kernel(KERNEL).not_supported_reasons(CUDA_BF16)
    assert (
        "block_sparse_attn 0.0.1 is older than lcab's adapter supports (lcab needs >= 0.0.2 "
        "(the Dec 2025 source tree with Hopper/Blackwell builds))" in reasons
    )


def test_probe_old_version_from_module_without_metadata(on_cuda) -> None:
    install(on_cuda, version="0.0.1")
    version(on_cuda, None)
    (reason,) = get_kernel(KERNEL).package_reasons(CUDA_BF16.device)
    assert reason.startswith("block_sparse_attn 0.0.1 is older than lcab's adapter supports")


def test_probe_missing_keyword(on_cuda) -> None:
    install(on_cuda, block_sparse_attn_func=standin.block_sparse_attn_func_without_lse)
    version(on_cuda, "0.0.2")
    (reason,) = get_kernel(KERNEL).package_reasons(CUDA_BF16.device)
    assert reason.startswith(
        "block_sparse_attn 0.0.2 has no return_attn_probs in block_sparse_attn_func"
    )


def test_probe_missing_function(on_cuda) -> None:
    mod = standin.bsa_module()
    del mod.block_sparse_attn_func
    on_cuda.setitem(sys.modules, "block_sparse_attn", mod)
    version(on_cuda, "0.0.2")
    (reason,) = get_kernel(KERNEL).package_reasons(CUDA_BF16.device)
    assert reason.startswith("block_sparse_attn 0.0.2 has no block_sparse_attn_func")


def test_probe_without_package_names_it(monkeypatch) -> None:
    version(monkeypatch, None)
    reasons = get_kernel(KERNEL).not_supported_reasons(CUDA_BF16)
    assert any(r.startswith("needs package 'block_sparse_attn', not installed") for r in reasons)


def test_standin_has_the_rows_signature() -> None:
    """A call v0.0.2 rejects (a missing p_dropout, an unknown keyword) fails in the stand-in."""
    assert inspect.signature(standin.block_sparse_attn_func) == (
        bsa_table.BLOCK_SPARSE_ATTN_FUNC.signature()
    )
    with pytest.raises(TypeError, match="p_dropout"):
        standin.block_sparse_attn_func(*[None] * 10)
    with pytest.raises(TypeError, match="return_softmax_lse"):
        standin.block_sparse_attn_func(*[None] * 11, return_softmax_lse=True)
