"""sparse_vsa / sparse_vsa_triton: CPU contract tests against a stand-in of fastvideo-kernel 0.3.x.

* lowering semantics: the adapter's recorded q2k_idx / q2k_num / variable_block_sizes, turned
  into a dense mask by an emulator of the documented rule (``tests/helpers/standin_vsa.py``),
  equal ``AttnMask.to_dense()`` (per head) for every mask the kernels claim, and padded keys
  are never attended; a mask is claimed exactly when each of its 64x64 tiles is all attended
  or all empty (checked here on the dense mask, independently of lcab's block table), and any
  other mask is refused with a reason;
* contract: the whole path (padding to 64, layouts, per-head indices, LSE units and layout of
  each backend, empty rows, autograd) on the stand-in computing in float64, against lcab's fp64
  reference: out, lse, dq, dk, dv;
* the version probe and the ThunderKittens checks give precise reasons.

The production capability checks are not weakened: the tests call ``Kernel.prepare`` directly
with a CPU float problem (``not_supported_reasons`` would refuse it, as it should).
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.kernels import Problem, get_kernel, packages, vsa
from lcab.kernels.upstream import vsa as vsa_table
from lcab.masks import AttnMask, make_mask
from tests.helpers import standin_vsa as standin
from tests.helpers.contract import forward_backward
from tests.helpers.masks import ALL_PATTERNS, dense3, fast, pattern_masks, restricted

KERNELS = ["sparse_vsa", "sparse_vsa_triton"]
B = 64
D = 64


def install(mp: pytest.MonkeyPatch, **overrides) -> None:
    for name, module in standin.modules(**overrides).items():
        mp.setitem(sys.modules, name, module)


def heads_of(mask: AttnMask) -> int:
    """Hq = Hkv: the mask's heads, or 2 for a mask shared by all heads."""
    return mask.num_heads if mask.num_heads > 1 else 2


def prepare_and_run(kernel: str, mask: AttnMask, q, k, v):
    """prepare + run, as the benchmark does, on a CPU float problem (test-only bypass)."""
    prepared = get_kernel(kernel).prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
    return prepared, prepared.from_native(out), lse


def whole_tiles(dense: np.ndarray) -> bool:
    """Whether every 64x64 tile (edge tiles cropped) is all attended or all empty."""
    _, sq, sk = dense.shape
    for q0 in range(0, sq, B):
        for k0 in range(0, sk, B):
            tile = dense[:, q0 : q0 + B, k0 : k0 + B]
            if not (tile.all(axis=(1, 2)) | ~tile.any(axis=(1, 2))).all():
                return False
    return True


@st.composite
def block_sparse_64(draw: st.DrawFn) -> AttnMask:
    """lcab's block_sparse pattern on VSA's grid, any length (last block shorter), 1-2 heads."""
    return make_mask(
        "block_sparse",
        draw(st.integers(1, 300)),
        block_size=B,
        density=draw(st.integers(1, 100)) / 100,
        heads=draw(st.integers(1, 2)),
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def aligned_rectangles(draw: st.DrawFn) -> AttnMask:
    """A CP rectangle of a block_sparse_64 mask starting on the 64 grid (tiles stay whole)."""
    mask = draw(block_sparse_64())
    q0 = B * draw(st.integers(0, (mask.seqlen_q - 1) // B))
    k0 = B * draw(st.integers(0, (mask.seqlen_k - 1) // B))
    q1 = draw(st.integers(q0 + 1, mask.seqlen_q))
    k1 = draw(st.integers(k0 + 1, mask.seqlen_k))
    return mask.restrict((q0, q1), (k0, k1))


# ----------------------------------------------------------------------------- (a) semantics
def check_lowered_call(kernel: str, mask: AttnMask, must_claim: bool = False) -> None:
    heads = heads_of(mask)
    dense = dense3(mask)
    problem = Problem(*mask.shape, heads, heads, D, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel(kernel).not_supported_reasons(problem, mask)
    claimed = whole_tiles(dense)
    assert claimed or not must_claim, f"{mask!r} should be claimed"
    partial = [r for r in reasons if "partly attended" in r]
    if not claimed:
        assert partial, reasons
        return
    assert not partial and not any("mask" in r for r in reasons), reasons
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(mask.seqlen_q, heads, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(mask.seqlen_k, heads, 8, generator=gen, dtype=torch.float64) for _ in "kv")
    standin.CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        install(mp)
        _, out, lse = prepare_and_run(kernel, mask, q, k, v)
    (call,) = standin.CALLS
    padded = standin.allowed_of_call(call).numpy()
    sq, sk = mask.shape
    assert not padded[:, :, sk:].any(), "a padded key is attended"
    got = padded[:, :sq, :sk]
    want = np.broadcast_to(dense, got.shape)
    empty = ~want.any(-1)  # (H, Sq)
    if kernel == "sparse_vsa_triton":
        assert np.array_equal(got, want), np.argwhere(got != want)[0]
    else:  # TK: empty query blocks list block 0 once; the adapter blanks those rows
        assert np.array_equal(got & ~empty[..., None], want)
        assert np.array_equal(call["q2k_num"][0].numpy() >= 1, np.ones_like(empty[:, ::B]))
    assert torch.isneginf(lse[torch.from_numpy(empty)]).all()
    assert torch.all(out.transpose(0, 1)[torch.from_numpy(empty)] == 0)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(8)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask(kernel, name, data) -> None:
    check_lowered_call(kernel, data.draw(pattern_masks(name)))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_PATTERNS)
@fast(5)
@given(data=st.data())
def test_cpu_contract_emulated_call_mask_equals_dense_mask_cp_rectangles(kernel, name, data):
    check_lowered_call(kernel, data.draw(restricted(name)))


@pytest.mark.parametrize("kernel", KERNELS)
@fast(25)
@given(data=st.data())
def test_cpu_contract_claims_block_sparse_64_and_its_aligned_rectangles(kernel, data) -> None:
    check_lowered_call(kernel, data.draw(block_sparse_64()), must_claim=True)
    check_lowered_call(kernel, data.draw(aligned_rectangles()), must_claim=True)
    check_lowered_call(kernel, make_mask("full", data.draw(st.integers(1, 200))), must_claim=True)


# ----------------------------------------------------------------------------- (b) contract
def _with_empty_query_block() -> AttnMask:
    """Query block 1 attends nothing; the others whole 64x64 tiles (per head)."""
    tiles = np.array([[[1, 0, 1], [0, 0, 0], [0, 1, 1]], [[0, 1, 0], [0, 0, 0], [1, 1, 1]]])
    dense = tiles.astype(bool).repeat(B, 1).repeat(B, 2)[:, :170, :170]
    return AttnMask.from_dense(dense)


SPARSE = {"block_size": B, "density": 0.4}
CASES = {
    "block_sparse_shared": make_mask("block_sparse", 200, seed=1, **SPARSE),
    "block_sparse_per_head": make_mask("block_sparse", 256, seed=2, heads=2, **SPARSE),
    "full_unaligned": make_mask("full", 130),
    "empty_query_block": _with_empty_query_block(),
    # a CP step: Sq != Sk, neither a multiple of 64
    "rectangle": make_mask("block_sparse", 300, seed=3, heads=2, **SPARSE).restrict(
        (64, 230), (0, 200)
    ),
}


def tensors(mask: AttnMask, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(11)
    (sq, sk), h = mask.shape, heads_of(mask)
    q = torch.randn(sq, h, D, generator=gen, dtype=dtype)
    k = torch.randn(sk, h, D, generator=gen, dtype=dtype)
    v = torch.randn(sk, h, D, generator=gen, dtype=dtype)
    dout = torch.randn(sq, h, D, generator=gen, dtype=dtype)
    return q, k, v, dout


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kernel", KERNELS)
def test_cpu_contract_adapter_matches_fp64_reference(kernel, case, monkeypatch) -> None:
    mask = CASES[case]
    install(monkeypatch)
    q, k, v, dout = tensors(mask, torch.float64)
    standin.CALLS.clear()
    out, lse, grads = forward_backward(
        lambda *t: prepare_and_run(kernel, mask, *t)[1:], q, k, v, dout
    )
    assert [c["op"] for c in standin.CALLS] == ["tk" if kernel == "sparse_vsa" else "triton"]
    ref_out, ref_lse, ref_grads = forward_backward(
        lambda *t: get_kernel("reference")(*t, mask), q, k, v, dout
    )
    assert out.shape == q.shape and out.dtype == torch.float64
    assert lse.shape == (q.shape[1], mask.seqlen_q) and lse.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isposinf(lse).any() and not torch.isnan(lse).any()
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_cpu_contract_raw_lse_units_and_no_stats_backward(kernel, monkeypatch) -> None:
    """Triton's LSE is log2 (B, H, S), TK's -sqrt(D)·ln (B, H, S, 1); neither differentiable."""
    mask = CASES["empty_query_block"]
    install(monkeypatch)
    q, k, v, _ = tensors(mask, torch.float32)
    standin.CALLS.clear()
    prepared, out, lse = prepare_and_run(kernel, mask, q, k, v)
    raw = standin.CALLS[0]["lse"]
    assert raw.shape == ((1, 2, 192, 1) if kernel == "sparse_vsa" else (1, 2, 192))
    assert lse.dtype == torch.float32 and not lse.requires_grad
    ref_out, ref_lse = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    assert not get_kernel(kernel).caps.stats_backward
    native = [prepared.to_native(t) for t in (q, k, v)]
    with pytest.raises(NotImplementedError, match="merged softmax statistics"):
        prepared.backward(native[0], *native, prepared.to_native(out), lse)


def test_cpu_contract_undocumented_lse_shape_is_an_error(monkeypatch) -> None:
    def tokens_first(*args):
        out, lse = standin.block_sparse_attn_triton(*args)
        return out, lse[0].t()

    install(monkeypatch, block_sparse_attn_triton=tokens_first)
    q, k, v, _ = tensors(CASES["full_unaligned"], torch.float32)
    with pytest.raises(RuntimeError, match="returned an LSE of shape"):
        prepare_and_run("sparse_vsa_triton", CASES["full_unaligned"], q, k, v)


def test_variable_block_sizes_give_the_valid_keys_of_each_block() -> None:
    assert vsa.variable_block_sizes(200).tolist() == [64, 64, 64, 8]
    assert vsa.variable_block_sizes(128).tolist() == [64, 64]
    assert vsa.variable_block_sizes(5).tolist() == [5]


@pytest.mark.parametrize("kernel", KERNELS)
def test_cpu_contract_prepare_imports_lazily_and_names_the_package(kernel) -> None:
    assert "fastvideo_kernel" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="fastvideo_kernel"):
        get_kernel(kernel).prepare(make_mask("full", 64), Problem(64, 64, 1, 1, 64))


# ----------------------------------------------------------------------------- refusals
CUDA_BF16 = Problem(256, 256, 4, 4, 64, torch.bfloat16, torch.device("cuda"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_static_refusals(kernel) -> None:
    vsa_kernel = get_kernel(kernel)
    text = " ".join(vsa_kernel.not_supported_reasons(CUDA_BF16))
    assert "CUDA" in text and "fastvideo_kernel" in text and "not installed" in text
    gqa = Problem(256, 256, 8, 2, 96, torch.float16, torch.device("cuda"))
    text = " ".join(vsa_kernel.not_supported_reasons(gqa, None, "fwd_bwd"))
    assert "no GQA" in text and "head_dim 96" in text and "dtype float16" in text
    two_heads = make_mask("block_sparse", 256, block_size=B, heads=2)
    assert any("KV heads" in r for r in vsa_kernel.not_supported_reasons(CUDA_BF16, two_heads))
    coarse = make_mask("block_sparse", 256, block_size=128, density=0.3, seed=1)
    assert not any("partly" in r for r in vsa_kernel.not_supported_reasons(CUDA_BF16, coarse))
    fine = make_mask("block_sparse", 256, block_size=32, density=0.3, seed=1)
    (why,) = [r for r in vsa_kernel.not_supported_reasons(CUDA_BF16, fine) if "partly" in r]
    assert "64x64" in why and "block_size=64" in why


# ----------------------------------------------------------------------------- (c) probe
@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Pretend CUDA (an sm_90 GPU) is present, so the import-time checks run."""
    monkeypatch.setattr(packages, "cuda_present", lambda: True)
    monkeypatch.setattr(vsa, "cuda_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return monkeypatch


def version(mp: pytest.MonkeyPatch, found: str | None) -> None:
    mp.setattr(packages, "distribution_version", lambda names: found)


@pytest.mark.parametrize("kernel", KERNELS)
def test_probe_accepts_the_documented_api(kernel, on_cuda) -> None:
    install(on_cuda)
    version(on_cuda, "0.3.2")
    assert get_kernel(kernel).package_reasons(CUDA_BF16.device) == []
    assert get_kernel(kernel).extra_reasons(CUDA_BF16, "fwd_bwd") == []


@pytest.mark.parametrize("kernel", KERNELS)
def test_probe_old_version_alone_is_a_reason(kernel, monkeypatch) -> None:
    version(monkeypatch, "0.2.6")
    reasons = get_kernel(kernel).not_supported_reasons(CUDA_BF16)
    assert (
        "fastvideo_kernel.block_sparse_attn 0.2.6 is older than lcab's adapter supports (lcab "
        "needs >= 0.3.0, whose block-sparse ops take q2k_idx/q2k_num)"
    ) in reasons


@pytest.mark.parametrize(
    ("kernel", "op"),
    [("sparse_vsa", "block_sparse_attn_sm90"), ("sparse_vsa_triton", "block_sparse_attn_triton")],
)
def test_probe_missing_op(kernel, op, on_cuda) -> None:
    install(on_cuda, **{op: None})
    version(on_cuda, "0.2.6")
    assert get_kernel(kernel).package_reasons(CUDA_BF16.device) == [
        f"fastvideo_kernel.block_sparse_attn 0.2.6 has no {op} (lcab needs >= 0.3.0, whose "
        "block-sparse ops take q2k_idx/q2k_num)"
    ]


def test_probe_op_of_another_generation(on_cuda) -> None:
    install(on_cuda, block_sparse_attn_triton=standin.block_sparse_attn_triton_with_block_size)
    version(on_cuda, None)
    (reason,) = get_kernel("sparse_vsa_triton").package_reasons(CUDA_BF16.device)
    assert reason.startswith(
        "fastvideo_kernel.block_sparse_attn (version unknown)'s block_sparse_attn_triton "
        "requires block_size, which lcab's adapter does not pass"
    )


def test_thunderkittens_extension_missing_is_a_reason_triton_unaffected(on_cuda) -> None:
    install(on_cuda, _get_sm90_ops=standin.sm90_ops_missing)
    version(on_cuda, "0.3.2")
    (reason,) = get_kernel("sparse_vsa").extra_reasons(CUDA_BF16, "fwd")
    assert "ThunderKittens extension" in reason and "did not load" in reason
    assert get_kernel("sparse_vsa_triton").extra_reasons(CUDA_BF16, "fwd") == []


def test_thunderkittens_needs_sm90_exactly(on_cuda) -> None:
    install(on_cuda)
    version(on_cuda, "0.3.2")
    on_cuda.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    (reason,) = get_kernel("sparse_vsa").extra_reasons(CUDA_BF16, "fwd")
    assert "sm_90a only (this GPU is sm_100)" in reason
    assert get_kernel("sparse_vsa_triton").extra_reasons(CUDA_BF16, "fwd") == []


def test_standin_ops_have_the_rows_signatures() -> None:
    """The stand-in ops take exactly what the 0.3.5 sources define (the TK op's q is q_padded)."""
    assert inspect.signature(standin.block_sparse_attn_triton) == (
        vsa_table.BLOCK_SPARSE_ATTN_TRITON.signature()
    )
    assert inspect.signature(standin.block_sparse_attn_sm90) == (
        vsa_table.BLOCK_SPARSE_ATTN_SM90.signature()
    )
    with pytest.raises(TypeError, match="q"):
        standin.block_sparse_attn_sm90(q=None, k=None, v=None, q2k_idx=None, q2k_num=None,
                                       variable_block_sizes=None)  # fmt: skip


def test_lse_scales_follow_the_table() -> None:
    """Triton's M is log2 (x ln 2); TK's is -sqrt(D) times the natural log (/ -sqrt(D))."""
    assert vsa.natural_lse_scale(vsa_table.BLOCK_SPARSE_ATTN_TRITON, 64) == pytest.approx(
        0.6931471805
    )
    assert vsa.natural_lse_scale(vsa_table.BLOCK_SPARSE_ATTN_SM90, 64) == pytest.approx(-1 / 8)
