"""The ``sdpa`` kernel pins the backend PyTorch would choose, and names it (CPU tests of our side).

PyTorch's choice (``torch._fused_sdp_choice``) is monkeypatched: these tests show that lcab asks
it about the problem's exact shapes, strides, dtype, mask and grad mode, pins the answer with
``sdpa_kernel`` and exposes it as ``backend_used``. They are no evidence of what PyTorch picks on
a GPU, nor that the fake-tensor route reaches the CUDA selection: the GPU test at the end checks
that on a machine with CUDA.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.attention import SDPBackend

from lcab.kernels import Problem, get_kernel, sdpa
from lcab.masks import make_mask
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
def test_prepare_asks_pytorch_about_the_exact_problem(mask_name, as_on_cuda, monkeypatch):
    asked = choose(monkeypatch, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
    mask = make_mask(mask_name, S) if mask_name == "causal" else make_mask(mask_name, S, window=5)
    prepared = get_kernel("sdpa").prepare(mask, Problem(S, S, HQ, HKV, D))
    assert prepared.choices == {False: "CUDNN_ATTENTION", True: "EFFICIENT_ATTENTION"}
    assert prepared.backend_used == "CUDNN_ATTENTION"
    assert prepared.backend_resolved_at == "prepare"
    assert [a["grad"] for a in asked] == [False, True]
    for call in asked:
        assert call["fake"]  # no memory spent on the probe tensors
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


def test_without_the_fake_route_the_first_call_chooses_on_real_tensors(
    as_on_cuda, pins, monkeypatch
):
    asked = choose(monkeypatch, SDPBackend.FLASH_ATTENTION, SDPBackend.FLASH_ATTENTION)
    real_only = torch._fused_sdp_choice

    def no_fake(q, *args, **kwargs):
        if isinstance(q, FakeTensor):
            raise RuntimeError("no fake-tensor route in this torch")
        return real_only(q, *args, **kwargs)

    monkeypatch.setattr(torch, "_fused_sdp_choice", no_fake)
    prepared = get_kernel("sdpa").prepare(make_mask("causal", S), Problem(S, S, HQ, HKV, D))
    assert prepared.choices == {} and prepared.backend_used is None
    assert prepared.backend_resolved_at is None
    run(prepared, *qkv())
    run(prepared, *qkv())
    assert pins == [SDPBackend.FLASH_ATTENTION] * 2
    assert prepared.backend_used == "FLASH_ATTENTION"
    assert prepared.backend_resolved_at == "first call"
    assert len(asked) == 1 and not asked[0]["fake"]  # chosen once, on the real tensors


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


@run_if(cuda=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mask_name", ["causal", "sliding_window"])
def test_gpu_prepare_choice_equals_pytorchs_choice_on_real_tensors(mask_name, dtype):
    """On a GPU: the fake-tensor choice is the one PyTorch makes for the real tensors."""
    cuda = torch.device("cuda")
    problem = Problem(1024, 1024, 8, 2, 128, dtype, cuda)
    window = {} if mask_name == "causal" else {"window": 128}
    prepared = get_kernel("sdpa").prepare(make_mask(mask_name, 1024, **window), problem)
    assert prepared.backend_resolved_at == "prepare"
    for grad in (False, True):
        q = torch.randn(1024, 8, 128, dtype=dtype, device=cuda, requires_grad=grad)
        k, v = (
            torch.randn(1024, 2, 128, dtype=dtype, device=cuda, requires_grad=grad) for _ in "kv"
        )
        native = [prepared.to_native(t) for t in (q, k, v)]
        assert prepared.choices[grad] == prepared._default_backend(*native, prepared.bias)
