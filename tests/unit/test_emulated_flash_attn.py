"""lcab's FA2 path through flash-attn 2.8.3.post2's own Python, its extension emulated on CPU.

The library's ``flash_attn/__init__.py`` and ``flash_attn_interface.py`` are imported unchanged
from the PyPI sdist (`tests.helpers.emulated_flash_attn`): its ``torch.library.custom_op``
wrappers, its padding, its reshapes and its calls into ``flash_attn_2_cuda`` are the real ones;
only that extension is emulated, following ``csrc/flash_attn/flash_api.cpp``
(`tests.helpers.emulated_flash_attn_2_cuda`). A stand-in built from lcab's own table agreed
with lcab while the real library (custom ops, whose signature is ``(*args, **kwargs)``) refused
every FA2 backward; here the library itself is what lcab meets.

Expectations are independent: the fp64 reference kernel and its autograd gradients.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lcab.kernels import Problem, flash_attn, flash_backward, get_kernel
from lcab.kernels.upstream import flash_attn as fa_table
from lcab.masks import make_mask
from tests.helpers import emulated_flash_attn, standin_flash_attn
from tests.helpers import emulated_flash_attn_2_cuda as emulated
from tests.helpers.contract import tensors
from tests.helpers.upstream_source import sdist_member
from tests.unit.test_stats_backward import CUTS, MASKS, assert_close, blockwise, reference

TOL = 1e-10
HEADS = {"gqa": (4, 2), "mha": (3, 3)}


@pytest.fixture(scope="module")
def interface() -> Iterator[object]:
    with emulated_flash_attn.loaded() as module:
        yield module


@pytest.fixture(autouse=True)
def _float64_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulated, "ALLOW_FLOAT64", True)
    monkeypatch.setattr(emulated, "FLOAT32_LSE", False)
    emulated.CALLS.clear()


def same_operator(packet: Any, qualname: str) -> bool:
    """Whether ``packet`` is the operator registered as ``qualname``: by name and schema.

    Never by identity: ``torch.ops`` caches one packet per name, and once another import's ops
    are destroyed (`emulated_flash_attn` drops them after a test module) the cache entry goes
    and the next lookup builds a new packet for the same operator — a test run in another
    order then compared two packets of one op and failed.
    """
    namespace, name = qualname.split("::")
    live = getattr(getattr(torch.ops, namespace), name)
    return packet._qualified_op_name == live._qualified_op_name == qualname and str(
        packet.default._schema
    ) == str(live.default._schema)


def test_operators_are_compared_by_name_and_schema_not_identity(interface) -> None:
    """After torch.ops forgets a packet (as when another import's ops are dropped first), the
    library's packet and a fresh lookup are different objects of the same operator."""
    kept = interface._wrapped_flash_attn_backward
    namespace = torch.ops.flash_attn
    delattr(namespace, "_flash_attn_backward")  # what dropping the ops does to the cache
    fresh = torch.ops.flash_attn._flash_attn_backward
    assert fresh is not kept  # what the identity test saw in the other order
    assert same_operator(kept, "flash_attn::_flash_attn_backward")
    assert not same_operator(kept, "flash_attn::_flash_attn_forward")


def test_the_library_files_are_the_sdists_and_only_the_extension_is_emulated(interface) -> None:
    root = Path(interface.__file__).parents[1]
    for member in emulated_flash_attn.FILES:
        text = sdist_member(emulated_flash_attn.DISTRIBUTION, emulated_flash_attn.VERSION, member)
        assert (root / member).read_text() == text
    assert sys.modules["flash_attn"].__file__ == str(root / "flash_attn" / "__init__.py")
    assert interface.flash_attn_gpu.bwd is emulated.bwd  # the extension the library calls


def test_fa2_backward_is_admitted_through_the_librarys_custom_ops(interface, monkeypatch) -> None:
    op = interface._flash_attn_backward
    assert tuple(inspect.signature(op).parameters) == ("args", "kwargs")  # what lcab once read
    assert flash_backward.callable_kind(op) == "custom_op"
    assert same_operator(interface._wrapped_flash_attn_backward, "flash_attn::_flash_attn_backward")
    kernel = get_kernel("fa2")
    assert kernel.library_backward_reasons() == []
    assert kernel.library_backward() is not None
    monkeypatch.setattr(flash_attn, "cuda_present", lambda: True)  # as on a GPU machine
    monkeypatch.setattr(kernel, "environment_reasons", lambda device: [])
    problem = Problem(4096, 4096, 8, 2, 128, torch.bfloat16, torch.device("cuda"))
    assert kernel.stats_backward_reasons(problem) == []


def test_refusals_name_the_real_cause(monkeypatch) -> None:
    def install(**overrides) -> list[str]:
        for name, module in standin_flash_attn.fa2_modules(**overrides).items():
            monkeypatch.setitem(sys.modules, name, module)
        return get_kernel("fa2").library_backward_reasons()

    def other(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal):
        raise AssertionError("never called")

    (missing,) = install(_flash_attn_backward=None)
    assert missing == "flash_attn.flash_attn_interface._flash_attn_backward is missing"
    (wrong_kind,) = install(_flash_attn_varlen_backward=3)
    assert wrong_kind.endswith("_flash_attn_varlen_backward is int")
    (wrong_params,) = install(_flash_attn_backward=other)
    assert "(function) has parameters (dout, q, k, v, out, softmax_lse, dq, dk, dv, " in (
        wrong_params
    )
    assert f"not ({', '.join(fa_table.FA2_BACKWARD.params)})" in wrong_params
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", None)
    assert get_kernel("fa2").library_backward_reasons() == [
        "flash_attn.flash_attn_interface does not import"
    ]


@pytest.mark.parametrize("heads", sorted(HEADS))
@pytest.mark.parametrize("head_dim", [12, 16])
@pytest.mark.parametrize("mask_name", ["causal", "causal_document", "sliding_window"])
def test_forward_and_autograd_equal_the_reference(interface, mask_name, head_dim, heads) -> None:
    """lcab's forward (dense or varlen call) and flash-attn's own autograd backward."""
    mask = MASKS[mask_name]()
    q, k, v, dout = tensors(mask, *HEADS[heads], torch.float64, head_dim=head_dim)
    want_out, want_lse, want_grads = reference(mask, q, k, v, dout)
    prepared = get_kernel("fa2").prepare(mask, Problem.of(q, k))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = prepared.run(*leaves)
    assert float((out.detach() - want_out).abs().max()) <= TOL
    assert lse is not None and torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    assert float((lse.detach()[finite] - want_lse[finite]).abs().max()) <= TOL
    out.backward(dout)  # FlashAttnFunc.backward: _wrapped_flash_attn_backward, then padding cut
    assert_close([leaf.grad for leaf in leaves], want_grads)
    calls = {c["fn"] for c in emulated.CALLS}
    assert calls == ({"varlen_fwd", "varlen_bwd"} if prepared.varlen else {"fwd", "bwd"})


@pytest.mark.parametrize("head_dim", [12, 16])
@pytest.mark.parametrize("cuts", CUTS, ids=lambda c: f"{len(c) - 1}-blocks")
@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_merged_statistics_backward_per_block_equals_reference(
    interface, mask_name, cuts, head_dim
) -> None:
    """Ring CP's call: the private backward once per key block with the merged (out, lse)."""
    mask = MASKS[mask_name]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=head_dim)
    out, lse, want = reference(mask, q, k, v, dout)
    got = blockwise("fa2", mask, cuts, q, k, v, dout, out, lse)
    assert_close(got, want)
    backward = [c for c in emulated.CALLS if c["fn"] in ("bwd", "varlen_bwd")]
    assert len(backward) == len(cuts) - 1  # one library call per block, none bypassed


def test_bfloat16_through_the_extension_as_a_gpu_takes_it(interface, monkeypatch) -> None:
    """fp16/bf16 only, the LSE float32: the path a GPU runs, against the fp64 reference."""
    monkeypatch.setattr(emulated, "ALLOW_FLOAT64", False)
    mask = MASKS["causal_document"]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    out, lse, want = reference(mask, q, k, v, dout)
    low = [t.to(torch.bfloat16) for t in (q, k, v, dout, out)]
    got = blockwise("fa2", mask, CUTS[2], *low[:4], low[4], lse)
    for g, w in zip(got, want, strict=True):
        assert float((g.double() - w).abs().max()) <= 0.05 * float(w.abs().max())
    assert {c["lse"].dtype for c in emulated.CALLS} == {torch.float32}
    prepared = get_kernel("fa2").prepare(mask, Problem.of(q, k))
    with pytest.raises(emulated.TorchCheckError, match="only support fp16 and bf16"):
        prepared.run(q, k, v)


def test_the_extension_fails_loudly_where_a_gpu_is_silently_wrong(interface) -> None:
    """The raw LSE the kernel reads unchecked, and the checks flash_api.cpp does make."""
    mask = make_mask("causal", 16)
    q, k, v, dout = (t.to(torch.bfloat16).unsqueeze(0) for t in tensors(mask, 4, 2, torch.float64))
    out = torch.randn_like(q)
    lse = torch.zeros(1, 4, 16, dtype=torch.float32)

    def call(**changes):
        args = {"dout": dout, "q": q, "k": k, "v": v, "out": out, "softmax_lse": lse}
        args |= {"dq": torch.empty_like(q), "dk": torch.empty_like(k), "dv": torch.empty_like(v)}
        args |= changes
        interface._wrapped_flash_attn_backward(
            *args.values(), 0.0, 0.25, True, -1, -1, 0.0, None, False, rng_state=None
        )

    call()  # as given, it runs
    for bad, why in [
        ({"softmax_lse": lse.double()}, "without an error"),
        ({"softmax_lse": lse.to(torch.bfloat16)}, "without an error"),
        ({"softmax_lse": lse[0].t().contiguous().t().unsqueeze(0)}, "contiguous=False"),
        ({"softmax_lse": lse[0]}, r"softmax_lse \(4, 16\)"),
        ({"dq": torch.empty_like(q, dtype=torch.float32)}, "dq must have the same dtype as q"),
        ({"q": q[..., :12], "k": k[..., :12], "v": v[..., :12]}, "multiple of 8"),
    ]:
        with pytest.raises(emulated.TorchCheckError, match=why):
            call(**bad)


def test_fa2_window_rewrites_as_flash_api_cpp(interface) -> None:
    """A side ≥ seqlen_k becomes -1, then an unbounded side facing a bounded one seqlen_k."""
    q, k, v, _ = (t.unsqueeze(0) for t in tensors(make_mask("causal", 10), 2, 2, torch.float64))
    flash = sys.modules["flash_attn"]
    flash.flash_attn_func(q, k, v, window_size=(100, 0))
    flash.flash_attn_func(q, k, v, window_size=(3, -1))
    flash.flash_attn_func(q, k, v, causal=True)
    assert [c["window"] for c in emulated.CALLS] == [(10, 0), (3, 10), (10, 0)]


def test_the_lse_goes_back_in_the_dtype_the_forward_returned(interface, monkeypatch) -> None:
    """An extension whose LSE is float32 even for float64 inputs gets float32 back (as the
    library's own autograd hands back its saved LSE); a wrong dtype would fail the check."""
    monkeypatch.setattr(emulated, "FLOAT32_LSE", True)
    mask = MASKS["causal_document"]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    out, lse, want = reference(mask, q, k, v, dout)
    prepared = get_kernel("fa2").prepare(mask, Problem.of(q, k))
    _, own_lse = prepared.run(q, k, v)
    assert own_lse is not None and own_lse.dtype == torch.float64  # lcab's convention
    got = prepared.backward(dout, q, k, v, out, lse)
    assert [c["lse"].dtype for c in emulated.CALLS] == [torch.float32, torch.float32]
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= 1e-5 * float(w.abs().max())


@pytest.mark.parametrize("head_dim", [12, 16])
@pytest.mark.parametrize("mask_name", ["causal", "sliding_window", "causal_document"])
def test_bfloat16_forward_and_autograd_as_a_gpu_takes_them(
    interface, monkeypatch, mask_name: str, head_dim: int
) -> None:
    """The strict path end to end: lcab's forward through the public ``flash_attn_func`` /
    ``flash_attn_varlen_func`` (padding a head dim of 12 to 16) and autograd through the
    library's own backward, bf16 in, float32 LSE, against the fp64 reference."""
    monkeypatch.setattr(emulated, "ALLOW_FLOAT64", False)
    mask = MASKS[mask_name]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=head_dim)
    out_ref, lse_ref, want = reference(mask, q, k, v, dout)
    leaves = [t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]
    out, lse = get_kernel("fa2").prepare(mask, Problem.of(*leaves[:2])).run(*leaves)
    assert lse is not None and lse.dtype == torch.float32
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert float((lse.detach().double() - lse_ref)[finite].abs().max()) <= 1e-2
    assert float((out.detach().double() - out_ref).abs().max()) <= 0.02 * float(out_ref.abs().max())
    out.backward(dout.to(torch.bfloat16))
    for leaf, w in zip(leaves, want, strict=True):
        assert leaf.grad is not None and leaf.grad.dtype == torch.bfloat16
        assert float((leaf.grad.double() - w).abs().max()) <= 0.05 * float(w.abs().max())
    kinds = {c["fn"] for c in emulated.CALLS}
    assert kinds & {"fwd", "varlen_fwd"} and kinds & {"bwd", "varlen_bwd"}  # both really ran
    assert {c["lse"].dtype for c in emulated.CALLS if "lse" in c} == {torch.float32}


def test_a_backward_before_any_forward_hands_the_kernels_their_float32_lse(
    interface, monkeypatch
) -> None:
    """An extension that takes float64 inputs but keeps the C++'s float32 LSE (an emulation
    other than lcab's may): a block's backward with no forward of its own still gives it
    float32, the kernels' dtype, rather than the inputs' float64."""
    monkeypatch.setattr(emulated, "FLOAT32_LSE", True)
    mask = MASKS["causal"]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    out, lse, want = reference(mask, q, k, v, dout)
    prepared = get_kernel("fa2").prepare(mask, Problem.of(q, k))
    got = prepared.backward(dout, q, k, v, out, lse)  # no run first
    assert [c["lse"].dtype for c in emulated.CALLS] == [torch.float32]
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= 1e-5 * float(w.abs().max())
