"""The backward from merged softmax statistics of FA2, FA3, FFA and Flex, block by block.

Ring-style CP calls a kernel's backward once per block of keys with the *merged* (out, lse) of
the whole row. Here each key range of a mask is one such block: the library's backward (a
stand-in built from the upstream table, computing FlashAttention's backward algorithm) is
called per block with the fp64 reference's out and lse, and dq summed over the blocks, dk and dv
put side by side, must equal the reference's autograd gradients. The reference differentiates
the whole attention; the stand-ins never see lcab's generic route — so neither side can share
the other's mistake.

Also: the LSEs of these libraries require grad on a GPU while their backward drops its gradient
(the stand-ins behave the same), which is why the generic route is chosen by a class flag
(`PreparedAttention.lse_grad`) and never by ``requires_grad``; and FlexAttention's own facts
(differentiable LSE, no CPU backward) are checked against torch itself.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import sys

import pytest
import torch

from lcab.cp import STRATEGIES
from lcab.kernels import PreparedAttention, Problem, flash_attn, get_kernel, magi_ffa
from lcab.kernels.fa2_window import fa2_spelling, fa2_window_reason
from lcab.kernels.upstream import flash_attn as fa_table
from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import to_varlen
from tests.helpers import standin_flash_attn, standin_magi_ffa
from tests.helpers.contract import tensors

TOL = 1e-10
MASKS = {
    "causal": lambda: make_mask("causal", 48),
    "sliding_window": lambda: make_mask("sliding_window", 48, window=5),
    "causal_document": lambda: make_mask(
        "causal_document", 48, seed=3, doc_source="uniform", min_doc_len=3, max_doc_len=20
    ),
    "prefix_lm_causal": lambda: make_mask("prefix_lm_causal", 48, prefix=11),
}
#: Key blocks of a 48-token mask: one, two (halves) and three uneven ones.
CUTS = ((0, 48), (0, 24, 48), (0, 7, 30, 48))


def install(mp: pytest.MonkeyPatch, kernel: str, **overrides) -> None:
    build = {
        "fa2": standin_flash_attn.fa2_modules,
        "fa3": standin_flash_attn.fa3_modules,
        "ffa": standin_magi_ffa.modules,
    }[kernel]
    for name, mod in build(**overrides).items():
        mp.setitem(sys.modules, name, mod)


def reference(mask: AttnMask, q, k, v, dout):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = get_kernel("reference")(*leaves, mask)
    out.backward(dout)
    return out.detach(), lse.detach(), [leaf.grad for leaf in leaves]


def blockwise(kernel: str, mask: AttnMask, cuts, q, k, v, dout, out, lse):
    """dq summed over key blocks, dk/dv per block side by side: what a ring assembles."""
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for k0, k1 in itertools.pairwise(cuts):
        block = mask.restrict((0, mask.seqlen_q), (k0, k1))
        refused = get_kernel(kernel).mask_reasons(block)
        if refused:  # never run, and never silently wrong: prepare refuses it too
            with pytest.raises(ValueError):
                get_kernel(kernel).prepare(block, Problem.of(q, k[k0:k1]))
            pytest.skip(f"{kernel} refuses keys {k0}:{k1} of this mask: {refused[0]}")
        prepared = get_kernel(kernel).prepare(block, Problem.of(q, k[k0:k1]))
        native = [prepared.to_native(t) for t in (dout, q, k[k0:k1], v[k0:k1], out)]
        prepared.run(*native[1:4])  # the step's forward first, as in a ring (its LSE's dtype)
        gq, gk, gv = prepared.backward(*native, lse)
        dq += prepared.from_native(gq)
        dks.append(prepared.from_native(gk))
        dvs.append(prepared.from_native(gv))
    return dq, torch.cat(dks), torch.cat(dvs)


def assert_close(got, want) -> None:
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        err = float((g - w).abs().max()) / float(w.abs().max())
        assert err <= TOL, f"{name}: normalised error {err:.2e}"


@pytest.mark.parametrize("cuts", CUTS, ids=lambda c: f"{len(c) - 1}-blocks")
@pytest.mark.parametrize("mask_name", sorted(MASKS))
@pytest.mark.parametrize(
    ("kernel", "head_dim", "generation"),
    [
        ("fa2", 16, None),
        ("fa2", 12, None),  # not a multiple of 8: the private backward needs padding
        ("fa3", 16, None),  # the newest backward: a custom op, as upstream's since c7697bbf
        ("fa3", 16, "aug_2025"),  # a plain function, as at 203b9b3d
        ("fa3", 16, "function"),  # the newest parameters as a plain function
        ("ffa", 16, None),
    ],
)
def test_library_backward_per_block_equals_reference(
    kernel, head_dim, generation, mask_name, cuts, monkeypatch
) -> None:
    overrides = {}
    if generation == "aug_2025":
        overrides["_flash_attn_backward"] = standin_flash_attn.fa3_flash_attn_backward_aug_2025
    if generation == "function":
        overrides["_flash_attn_backward"] = standin_flash_attn.fa3_flash_attn_backward_function
    install(monkeypatch, kernel, **overrides)
    mask = MASKS[mask_name]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=head_dim)
    out, lse, want = reference(mask, q, k, v, dout)
    standin_flash_attn.CALLS.clear()
    standin_magi_ffa.CALLS.clear()
    got = blockwise(kernel, mask, cuts, q, k, v, dout, out, lse)
    assert_close(got, want)
    calls = standin_magi_ffa.CALLS if kernel == "ffa" else standin_flash_attn.CALLS
    assert sum(c.get("fn") == "backward" for c in calls) >= 1  # the library's backward ran


def test_fa3_generations_are_told_apart_and_others_refused(monkeypatch) -> None:
    from lcab.kernels import flash_backward

    new = standin_flash_attn.fa3_flash_attn_backward
    old = standin_flash_attn.fa3_flash_attn_backward_aug_2025
    assert flash_backward.callable_kind(new) == fa_table.FA3_BACKWARD.kind == "custom_op"
    assert flash_backward.callable_kind(old) == fa_table.FA3_BACKWARD_AUG_2025.kind == "function"
    assert tuple(inspect.signature(new).parameters) == ("args", "kwargs")  # read by its function
    assert flash_backward.fa3_generation(new) is fa_table.FA3_BACKWARD
    assert flash_backward.fa3_generation(torch.ops.flash_attn_3._flash_attn_backward) is (
        fa_table.FA3_BACKWARD
    )  # the same op reached through torch.ops: read by its schema
    assert flash_backward.fa3_generation(old) is fa_table.FA3_BACKWARD_AUG_2025

    def other(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal):
        raise AssertionError("never called")

    assert flash_backward.fa3_generation(other) is None
    install(monkeypatch, "fa3", _flash_attn_backward=other)
    monkeypatch.setattr(flash_attn, "cuda_present", lambda: True)
    kernel = get_kernel("fa3")
    monkeypatch.setattr(kernel, "environment_reasons", lambda device: [])
    problem = Problem(64, 64, 4, 2, 64, torch.bfloat16, torch.device("cuda"))
    (reason,) = kernel.stats_backward_reasons(problem)
    assert "neither generation lcab calls" in reason and "203b9b3d" in reason
    assert "(function) has parameters (dout, q, k, v, out, softmax_lse, dq, dk, dv," in reason
    ring = STRATEGIES.get("ring")({}, 8)
    (why,) = ring.kernel_reasons(kernel, problem, "bwd")
    assert why.startswith("ring's backward needs the kernel's backward from merged softmax")
    prepared = kernel.prepare(make_mask("causal", 16), Problem(16, 16, 4, 2, 16, torch.float64))
    q, k, v, dout = tensors(make_mask("causal", 16), 4, 2, torch.float64)
    out, lse = prepared.run(q, k, v)
    with pytest.raises(NotImplementedError, match="no backward from merged statistics"):
        prepared.backward(dout, q, k, v, out, lse)


@pytest.mark.parametrize("kernel", ["fa2", "fa3", "ffa"])
def test_lse_requires_grad_yet_the_generic_route_is_never_taken(kernel, monkeypatch) -> None:
    """As on a GPU, the library's LSE requires grad and its gradient is dropped: a
    ``requires_grad`` guard would have let the generic route through, with wrong gradients."""
    install(monkeypatch, kernel)
    mask = MASKS["causal"]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64)
    out, lse, _want = reference(mask, q, k, v, dout)
    q, out, lse, dout = q[24:], out[24:], lse[:, 24:], dout[24:]  # rows 24-47 on keys 0-23
    block = mask.restrict((24, 48), (0, 24))
    prepared = get_kernel(kernel).prepare(block, Problem.of(q, k[:24]))
    leaves = [t.clone().requires_grad_(True) for t in (q, k[:24], v[:24])]
    _, block_lse = prepared.run(*leaves)
    assert block_lse.requires_grad  # what the old guard looked at
    assert not prepared.lse_grad
    generic = PreparedAttention.backward
    monkeypatch.setattr(type(prepared), "lse_grad", True)  # force the route the flag forbids
    wrong = generic(prepared, dout, q, k[:24], v[:24], out, lse)
    monkeypatch.setattr(type(prepared), "lse_grad", False)
    right = prepared.backward(dout, q, k[:24], v[:24], out, lse)
    assert float((wrong[0] - right[0]).abs().max()) > 1e-3  # the dropped gradient matters
    with pytest.raises(NotImplementedError, match="carries no gradient"):
        generic(prepared, dout, q, k[:24], v[:24], out, lse)


def test_fa2_swapped_gqa_path_is_never_given_a_window_that_takes_it(monkeypatch) -> None:
    """FA2's swapped path needs max_seqlen_q == 1 with both window sides -1 (L592).

    lcab's lowering never asks for it — a sequence of one query sees keys up to its
    bottom-right diagonal, so its window is causal — and should a window ever be (-1, -1)
    there, the adapter spells the left side as max_seqlen_k (turned back into -1 after the
    check); the stand-in emulates the swapped path and would reject the call otherwise.
    """
    install(monkeypatch, "fa2")
    dense = torch.zeros(6, 9, dtype=torch.bool)
    for row, (k0, k1) in enumerate([(0, 2), (2, 3), (4, 5), (5, 7), (7, 8), (8, 9)]):
        dense[row, k0:k1] = True  # key 3 is attended by nobody: a key-only sequence
    mask = AttnMask.from_dense(dense)
    args = to_varlen(mask)
    assert args.max_seqlen_q == 1 and args.causal
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    prepared = get_kernel("fa2").prepare(mask, Problem.of(q, k))
    out, _ = prepared.run(q, k, v)
    ref_out, ref_lse, want = reference(mask, q, k, v, dout)
    assert float((out - ref_out).abs().max()) <= TOL
    assert_close(blockwise("fa2", mask, (0, 9), q, k, v, dout, ref_out, ref_lse), want)
    unbounded = dataclasses.replace(args, causal=False, window_size=(-1, -1))
    spelled = fa2_spelling(unbounded, 6, gqa=True)  # a bounded left that never binds
    assert spelled is not None and spelled[0] >= 0 and spelled[1] == -1
    assert fa2_spelling(unbounded, 6, gqa=False) == (-1, -1)


def test_fa2_window_cut_to_max_seqlen_k_is_refused() -> None:
    """Queries longer than keys + 1 with a bounded left side: FA2 caps the right side."""
    dense = torch.zeros(8, 3, dtype=torch.bool)
    for row in range(8):  # bottom-right diagonal at row - 5, left window 1, right unbounded
        dense[row, max(row - 6, 0) :] = True
    mask = AttnMask.from_dense(dense)
    reason = fa2_window_reason(mask)
    assert reason is not None and "max_seqlen_k=3" in reason
    problem = Problem(8, 3, 2, 1, 64, torch.bfloat16, torch.device("cuda"))
    assert reason in get_kernel("fa2").not_supported_reasons(problem, mask)
    assert fa2_window_reason(make_mask("sliding_window", 32, window=4)) is None


def test_fa3_refuses_head_dims_that_are_not_multiples_of_8() -> None:
    problem = Problem(64, 64, 4, 2, 60, torch.bfloat16, torch.device("cuda"))
    reasons = get_kernel("fa3").not_supported_reasons(problem)
    assert "FA3 takes head dims in multiples of 8, not 60" in reasons
    assert not any("multiples of 8" in r for r in get_kernel("fa2").not_supported_reasons(problem))


@pytest.mark.parametrize("strategy", ["ring", "usp", "loongtrain"])
@pytest.mark.parametrize("kernel", ["fa2", "fa3", "ffa", "flex"])
def test_ring_strategies_admit_the_backward_of_fast_kernels_on_cuda(strategy, kernel) -> None:
    problem = Problem(65536, 65536, 64, 8, 128, torch.bfloat16, torch.device("cuda"))
    cp = STRATEGIES.get(strategy)({}, 8)
    assert cp.kernel_reasons(get_kernel(kernel), problem, "bwd") == []
    reasons = cp.not_supported_reasons(get_kernel(kernel), problem, None, 8, "bwd")
    # on this machine: no CUDA and no package; nothing about the backward from statistics
    assert reasons and not any("merged softmax" in r for r in reasons)


def test_fa3_sm_margin_reaches_its_forward_and_backward(monkeypatch) -> None:
    """kernel.sm_margin (SMs left to NCCL under CP, gpu_review §2.10) goes to both FA3 calls."""
    install(monkeypatch, "fa3")
    mask = MASKS["causal"]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64)
    standin_flash_attn.CALLS.clear()
    prepared = get_kernel("fa3", sm_margin=8).prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(q, k, v)
    prepared.backward(dout, q, k, v, out, lse)
    backward = [c for c in standin_flash_attn.CALLS if c["fn"] == "backward"]
    assert prepared.kwargs["sm_margin"] == 8 and backward[0]["kwargs"]["sm_margin"] == 8
    assert get_kernel("fa3").options == {"sm_margin": 0}
    with pytest.raises(ValueError, match="unknown option"):
        get_kernel("fa2", sm_margin=8)  # FA2 has no such parameter


def test_ffa_sm_margin_reaches_its_forward_and_backward(monkeypatch) -> None:
    """kernel.sm_margin goes to both FFA calls, as MagiAttention's dist_attn passes its own."""
    install(monkeypatch, "ffa")
    mask = MASKS["causal"]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64)
    standin_magi_ffa.CALLS.clear()
    prepared = get_kernel("ffa", sm_margin=6).prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(q, k, v)
    prepared.backward(dout, q, k, v, out, lse)
    forward, backward = standin_magi_ffa.CALLS
    assert forward["kwargs"]["sm_margin"] == 6 and backward["kwargs"]["sm_margin"] == 6
    assert get_kernel("ffa").options == {"sm_margin": 0}


def test_ffa_reduces_into_float32_accumulators_never_rounded(monkeypatch) -> None:
    """As MagiAttention's dist_attn: dq/dk/dv handed to FFA in float32 and returned so."""
    install(monkeypatch, "ffa")
    mask = MASKS["causal"]()
    q, k, v, dout = (t.to(torch.bfloat16) for t in tensors(mask, 4, 2, torch.float64))
    standin_magi_ffa.CALLS.clear()
    prepared = get_kernel("ffa").prepare(mask, Problem.of(q, k))
    out, lse = prepared.run(q, k, v)
    grads = prepared.backward(dout, q, k, v, out, lse)
    assert [g.dtype for g in grads] == [torch.float32] * 3
    (call,) = [c["kwargs"] for c in standin_magi_ffa.CALLS if c.get("fn") == "backward"]
    assert all(call[n] is g for n, g in zip(("dq", "dk", "dv"), grads, strict=True))
    assert call["lse"].dtype == torch.float32


def test_ffa_refusal_names_the_real_cause(monkeypatch) -> None:
    """A backward of another generation: both parameter lists in the reason, as for FA2/FA3."""
    install(monkeypatch, "ffa", _flex_flash_attn_backward=standin_magi_ffa.backward_before_v1_1)
    monkeypatch.setattr(magi_ffa, "cuda_present", lambda: True)
    kernel = get_kernel("ffa")
    monkeypatch.setattr(kernel, "environment_reasons", lambda device: [])
    problem = Problem(4096, 4096, 8, 2, 128, torch.bfloat16, torch.device("cuda"))
    (reason,) = kernel.stats_backward_reasons(problem)
    assert "_flex_flash_attn_backward (function) has parameters (dout, q, k, v, out, lse, dq," in (
        reason
    )
    assert "not (dout, q, k, v, sink, sink_layout, out, lse" in reason and "v1.1.1" in reason
    install(monkeypatch, "ffa")
    assert kernel.stats_backward_reasons(problem) == []


def test_fa3_aug_2025_gradients_are_taken_from_what_it_returns(monkeypatch) -> None:
    """The 2025-08 generation returns (dq, dk, dv, softmax_d): a build that fills fresh
    tensors rather than the buffers it was given must still give the right gradients."""
    from tests.helpers.standin_rows import from_row

    def fresh_buffers(a):
        a = dict(a) | {name: torch.zeros_like(a[name]) for name in ("dq", "dk", "dv")}
        return standin_flash_attn._fa3_backward_aug_2025(a)

    row = fa_table.FA3_BACKWARD_AUG_2025
    install(monkeypatch, "fa3", _flash_attn_backward=from_row(row, fresh_buffers))
    mask = MASKS["causal"]()
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    out, lse, want = reference(mask, q, k, v, dout)
    assert_close(blockwise("fa3", mask, CUTS[1], q, k, v, dout, out, lse), want)
