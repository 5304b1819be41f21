"""The ``sdpa`` kernel pins the backend PyTorch would choose, and names it (CPU tests of our side).

PyTorch's choice (``torch._fused_sdp_choice``) is monkeypatched: these tests show that lcab asks
it about the call's real tensors (shapes, strides, dtype, mask, grad mode), pins the answer with
``sdpa_kernel`` and exposes it as ``backend_used``. They are no evidence of what PyTorch picks on
a GPU: the GPU test at the end compares the pinned backend with the kernels a plain call
launches, as `tests.gpu.sdpa_choice` does on the GPU machine.

Rows that attend no key are tested through the same code path as on CUDA (the ``as_on_cuda``
fixture, and the pinned ``sdpa_math`` on CPU): no backend is handed a row of only -inf, and with
a backend that follows SDPA's documented reference (NaN on such a row) the output and gradients
still equal lcab's fp64 reference.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.attention import SDPBackend

from lcab.cp.ring_attention import merge_into
from lcab.kernels import Problem, get_kernel, sdpa
from lcab.masks import AttnMask, make_mask
from tests.helpers.run_if import run_if

S, HQ, HKV, D = 48, 4, 2, 8


@pytest.fixture
def pins(monkeypatch: pytest.MonkeyPatch) -> list[SDPBackend]:
    """Record every ``sdpa_kernel`` pin (without restricting CPU dispatch)."""
    pinned: list[SDPBackend] = []

    @contextlib.contextmanager
    def record(backend):
        pinned.append(backend)
        yield

    monkeypatch.setattr(sdpa, "sdpa_kernel", record)
    return pinned


@pytest.fixture
def as_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the CUDA path on CPU tensors: the default kernel does not call the CPU flash op."""
    monkeypatch.setattr(sdpa, "calls_cpu_flash_op", lambda backend, device: False)


def choose(monkeypatch: pytest.MonkeyPatch, without_grad: SDPBackend, with_grad: SDPBackend):
    """Patch PyTorch's choice: one backend for inference, another when inputs need grad."""
    asked: list[dict] = []

    def fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, *, scale, enable_gqa):
        asked.append(
            {
                "fake": isinstance(q, FakeTensor),
                "shapes": [tuple(t.shape) for t in (q, k, v)],
                "q_stride": q.stride(),
                "dtype": q.dtype,
                "grad": q.requires_grad,
                "mask": None if attn_mask is None else tuple(attn_mask.shape),
                "dropout_p": dropout_p,
                "is_causal": is_causal,
                "scale": scale,
                "enable_gqa": enable_gqa,
            }
        )
        return int((with_grad if q.requires_grad else without_grad).value)

    monkeypatch.setattr(torch, "_fused_sdp_choice", fused_sdp_choice)
    return asked


def qkv(requires_grad: bool = False):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(S, HQ, D, generator=gen)
    k, v = (torch.randn(S, HKV, D, generator=gen) for _ in "kv")
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def run(prepared, q, k, v):
    out, lse = prepared.run(*(prepared.to_native(t) for t in (q, k, v)))
    return prepared.from_native(out), lse


@pytest.mark.parametrize("mask_name", ["causal", "sliding_window"])
def test_the_first_call_asks_pytorch_about_its_real_tensors(
    mask_name, as_on_cuda, pins, monkeypatch
):
    asked = choose(monkeypatch, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
    mask = make_mask(mask_name, S) if mask_name == "causal" else make_mask(mask_name, S, window=5)
    prepared = get_kernel("sdpa").prepare(mask, Problem(S, S, HQ, HKV, D))
    assert prepared.choices == {} and prepared.backend_used is None  # nothing asked at prepare
    assert prepared.backend_resolved_at is None and asked == []
    run(prepared, *qkv())
    run(prepared, *qkv(requires_grad=True))
    run(prepared, *qkv(requires_grad=True))  # each grad mode asked once
    assert prepared.choices == {False: "CUDNN_ATTENTION", True: "EFFICIENT_ATTENTION"}
    assert prepared.backend_resolved_at == "first call"
    assert [a["grad"] for a in asked] == [False, True]
    for call in asked:
        assert not call["fake"]  # the real tensors: a fake CUDA tensor's answer is the meta one
        assert call["shapes"] == [(1, HQ, S, D), (1, HKV, S, D), (1, HKV, S, D)]
        assert call["q_stride"][1:] == (D, HQ * D, 1)  # the native view of packed q
        assert call["dtype"] == torch.float32 and call["dropout_p"] == 0.0
        assert call["scale"] == pytest.approx(D**-0.5) and call["enable_gqa"] is True
        causal = mask_name == "causal"
        assert call["is_causal"] is causal
        assert call["mask"] == (None if causal else (1, 1, S, S))


def test_run_pins_the_choice_of_its_grad_mode(as_on_cuda, pins, monkeypatch):
    choose(monkeypatch, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
    mask = make_mask("causal", S)
    prepared = get_kernel("sdpa").prepare(mask, Problem(S, S, HQ, HKV, D))
    q, k, v = qkv()
    out, lse = run(prepared, q, k, v)
    assert pins == [SDPBackend.CUDNN_ATTENTION] and prepared.backend_used == "CUDNN_ATTENTION"
    assert lse is None
    ref_out, _ = get_kernel("reference")(q.double(), k.double(), v.double(), mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    run(prepared, *qkv(requires_grad=True))
    assert pins[-1] == SDPBackend.EFFICIENT_ATTENTION
    assert prepared.backend_used == "EFFICIENT_ATTENTION"
    with torch.no_grad():  # inputs that require grad, but no graph: the inference choice
        run(prepared, *qkv(requires_grad=True))
    assert pins[-1] == SDPBackend.CUDNN_ATTENTION


def test_pinned_variants_and_the_cpu_path_do_not_ask(pins, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("only the unpinned CUDA kernel asks PyTorch")

    monkeypatch.setattr(torch, "_fused_sdp_choice", never)
    mask = make_mask("causal", S)
    math = get_kernel("sdpa_math").prepare(mask, Problem(S, S, HQ, HKV, D))
    assert math.backend_used == "MATH"
    run(math, *qkv())
    assert pins == [SDPBackend.MATH]
    cpu = get_kernel("sdpa").prepare(mask, Problem(S, S, HQ, HKV, D))
    _, lse = run(cpu, *qkv())
    assert cpu.backend_used == "FLASH_ATTENTION" and lse is not None  # the CPU flash op
    assert pins == [SDPBackend.MATH]  # called directly, not through sdpa_kernel


@pytest.mark.gpu
@run_if(cuda=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mask_name", ["causal", "sliding_window"])
def test_gpu_choice_is_the_backend_a_plain_sdpa_call_launches(mask_name, dtype):
    """On a GPU: the backend lcab pins is the one whose kernels a plain F.sdpa call launches."""
    from tests.gpu.sdpa_choice import backend_of, traced_kernels

    cuda = torch.device("cuda")
    problem = Problem(1024, 1024, 8, 2, 128, dtype, cuda)
    window = {} if mask_name == "causal" else {"window": 128}
    prepared = get_kernel("sdpa").prepare(make_mask(mask_name, 1024, **window), problem)
    for grad in (False, True):
        q = torch.randn(1024, 8, 128, dtype=dtype, device=cuda, requires_grad=grad)
        k, v = (
            torch.randn(1024, 2, 128, dtype=dtype, device=cuda, requires_grad=grad) for _ in "kv"
        )
        native = [prepared.to_native(t) for t in (q, k, v)]
        prepared.run(*native)

        def plain(native=native, grad=grad) -> None:
            out = torch.nn.functional.scaled_dot_product_attention(
                *native, attn_mask=prepared.bias, is_causal=prepared.is_causal, enable_gqa=True
            )
            if grad:
                out.backward(torch.ones_like(out))

        assert prepared.choices[grad] == backend_of(traced_kernels(plain))


# ----------------------------------------------------------------------------- rows with no key
def masks_with_empty_rows() -> list[AttnMask]:
    """Rows 0..11 of a CP block attending nothing; a per-KV-head mask with such rows in one."""
    block = make_mask("full_document", S, doc_lengths=[12, 20, 16]).restrict((0, S), (12, S))
    causal = make_mask("causal", S).slices
    late = np.array([[10, S, 0, S, 0]])  # head 1: rows 0..9 attend nothing
    per_head = AttnMask(
        np.concatenate([causal, late]), S, head_ptr=np.array([0, len(causal), len(causal) + 1])
    )
    return [block, per_head]


def documented_reference(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                         *, scale=None, enable_gqa=False):  # fmt: skip
    """SDPA as its docstring defines it (torch/nn/functional.py L6341-6380): a plain softmax of
    the biased scores, which gives NaN on a row whose bias is all -inf — what a backend may do."""
    assert dropout_p == 0.0 and not is_causal
    if enable_gqa:
        group = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
    scores = query @ key.transpose(-2, -1) * scale + attn_mask
    return torch.softmax(scores, dim=-1) @ value


@pytest.mark.parametrize("name", ["sdpa", "sdpa_math"])
@pytest.mark.parametrize("case", [0, 1], ids=["block", "per_head"])
def test_no_backend_is_handed_a_row_whose_bias_is_all_minus_inf(name, case, as_on_cuda, pins,
                                                                 monkeypatch):  # fmt: skip
    """The CUDA path (and the pinned variants) hand F.sdpa no row without a finite bias."""
    mask = masks_with_empty_rows()[case]
    seen: list[torch.Tensor] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(kwargs["attn_mask"])
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", recording)
    prepared = get_kernel(name).prepare(mask, Problem(*mask.shape, HQ, HKV, D))
    q, k, v = qkv()
    out, _ = run(prepared, q[: mask.seqlen_q], k[: mask.seqlen_k], v[: mask.seqlen_k])
    (bias,) = seen
    assert torch.isfinite(bias).any(-1).all(), "a row of only -inf reached the backend"
    empty = ~torch.as_tensor(mask.to_dense()).any(-1)  # (Sq,) or (H_mask, Sq)
    rows = out[empty] if empty.dim() == 1 else out.transpose(0, 1)[empty.repeat_interleave(2, 0)]
    assert rows.numel() > 0 and torch.all(rows == 0)


@pytest.mark.parametrize("case", [0, 1], ids=["block", "per_head"])
def test_cuda_path_gives_lcabs_convention_where_the_backend_gives_nan(case, as_on_cuda, pins,
                                                                     monkeypatch):  # fmt: skip
    """With a backend that follows SDPA's documented reference (NaN on an all -inf row), the
    output and the gradients still equal lcab's fp64 reference: out 0 on rows with no key."""
    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", documented_reference)
    mask = masks_with_empty_rows()[case]
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(mask.seqlen_q, HQ, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(mask.seqlen_k, HKV, D, generator=gen, dtype=torch.float64) for _ in "kv")
    dout = torch.randn_like(q)
    prepared = get_kernel("sdpa").prepare(mask, Problem.of(q, k))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = run(prepared, *leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, _ = get_kernel("reference")(*ref, mask)
    ref_grads = torch.autograd.grad(ref_out, ref, dout)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


def test_cpu_backward_of_a_block_with_rows_it_gives_no_key():
    """Ring-style: rows 0..11 attend keys of block 1 only; block 2's backward under the merged
    (out, lse) must give them nothing although their bias there is finite."""
    mask = make_mask("full_document", S, doc_lengths=[12, 20, 16])
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(S, HQ, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(S, HKV, D, generator=gen, dtype=torch.float64) for _ in "kv")
    dout = torch.randn_like(q)
    blocks = [(0, 12), (12, S)]
    out = torch.zeros_like(q)
    lse = torch.full((HQ, S), float("-inf"), dtype=torch.float64)
    parts = []
    for k0, k1 in blocks:
        part = get_kernel("sdpa").prepare(mask.restrict((0, S), (k0, k1)), Problem.of(q, k[k0:k1]))
        part_out, part_lse = run(part, q, k[k0:k1], v[k0:k1])
        merge_into(out, lse, part_out, part_lse)
        parts.append(part)
    dq, dks, dvs = torch.zeros_like(q), [], []
    native = parts[0].to_native
    for part, (k0, k1) in zip(parts, blocks, strict=True):
        gq, gk, gv = part.backward(
            native(dout), native(q), native(k[k0:k1]), native(v[k0:k1]), native(out), lse
        )
        dq += part.from_native(gq)
        dks.append(part.from_native(gk))
        dvs.append(part.from_native(gv))
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, _ = get_kernel("reference")(*ref, mask)
    ref_grads = torch.autograd.grad(ref_out, ref, dout)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    for got, want in zip((dq, torch.cat(dks), torch.cat(dvs)), ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
