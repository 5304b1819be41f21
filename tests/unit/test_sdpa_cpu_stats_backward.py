"""SDPA's CPU backward from merged statistics in bfloat16, as a CP ring calls it.

The CPU flash-attention backward reads its log-sum-exp in the accumulation type (float32 for
bf16/fp16 inputs); lcab handed it the inputs' dtype, so every bf16 ring/USP/LoongTrain cell with
``kernel=sdpa`` on CPU ended ``error`` ("expected scalar type Float but found BFloat16").
Here each key block's gradients, under the whole row's (out, lse), are summed and compared with
fp64 autograd of dense attention on the same bf16-rounded inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from lcab.kernels import Problem, get_kernel
from lcab.masks import make_mask

S, HQ, HKV, D = 96, 4, 2, 32


def dense_reference(q, k, v, dense, dout):
    """fp64 attention over a bool (Sq, Sk) mask, and its gradients (GQA by repetition)."""
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    qq, kk, vv = leaves[0], *(t.repeat_interleave(HQ // HKV, dim=1) for t in leaves[1:])
    scores = torch.einsum("qhd,khd->hqk", qq, kk) / math.sqrt(D)
    scores = scores.masked_fill(~dense, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vv)
    lse = torch.logsumexp(scores, -1)
    out.backward(dout.double())
    return out.detach(), lse.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("mask_name", ["causal", "full"])
def test_bf16_block_backward_under_merged_statistics(mask_name: str) -> None:
    torch.manual_seed(0)
    q = torch.randn(S, HQ, D).bfloat16()
    k, v = torch.randn(S, HKV, D).bfloat16(), torch.randn(S, HKV, D).bfloat16()
    dout = torch.randn(S, HQ, D).bfloat16()
    mask = make_mask(mask_name, S)
    out, lse, (dq_ref, dk_ref, dv_ref) = dense_reference(q, k, v, mask.to_dense().bool(), dout)
    kernel = get_kernel("sdpa")
    dq = torch.zeros(S, HQ, D, dtype=torch.float64)
    dk, dv = torch.zeros(S, HKV, D, dtype=torch.float64), torch.zeros_like(dk_ref)
    for lo, hi in ((0, 40), (40, S)):  # two key blocks, as two ring steps
        block = mask.restrict((0, S), (lo, hi))
        prepared = kernel.prepare(block, Problem.of(q, k[lo:hi]))
        native = [prepared.to_native(t) for t in (dout, q, k[lo:hi], v[lo:hi])]
        grads = prepared.backward(*native[:4], prepared.to_native(out.bfloat16()), lse.float())
        g = [prepared.from_native(t).double() for t in grads]
        dq += g[0]
        dk[lo:hi], dv[lo:hi] = g[1], g[2]
    for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert got.dtype == torch.float64 and torch.isfinite(got).all()
        err = (got - want).abs().max() / want.abs().max()
        assert err < 3e-2, err  # bf16 inputs, outputs and gradients: ~1e-2 relative
