"""What every adapter contract test (tests/unit/test_adapter_*.py) does the same way.

Random packed inputs for a mask, the forward + backward of any attention callable, and ring
attention on one process (`ring_forward_backward`, for a kernel's backward from merged
statistics), so each adapter's test file holds only what is specific to its library: the
stand-in, the cases, the library's layouts and conventions.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from lcab.cp.ring_attention import merge_into
from lcab.kernels import Kernel, Problem
from lcab.masks import AttnMask


def tensors(
    mask: AttnMask, hq: int, hkv: int, dtype: torch.dtype, head_dim: int = 16, seed: int = 11
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded packed q (Sq, Hq, D), k, v (Sk, Hkv, D) and dout (Sq, Hq, D) for ``mask``."""
    gen = torch.Generator().manual_seed(seed)
    sq, sk = mask.shape
    q = torch.randn(sq, hq, head_dim, generator=gen, dtype=dtype)
    k = torch.randn(sk, hkv, head_dim, generator=gen, dtype=dtype)
    v = torch.randn(sk, hkv, head_dim, generator=gen, dtype=dtype)
    dout = torch.randn(sq, hq, head_dim, generator=gen, dtype=dtype)
    return q, k, v, dout


def forward_backward(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """(out, lse, (dq, dk, dv)) of ``fn(q, k, v)`` with ``dout`` as the output's gradient."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), lse.detach(), grads


def chunks(length: int, world: int) -> list[tuple[int, int]]:
    """``world`` contiguous chunks of ``length``, unequal when ``world`` does not divide it."""
    return list(itertools.pairwise(round(length * r / world) for r in range(world + 1)))


def ring_blocks(mask: AttnMask, world: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Every (query chunk, key chunk) a ring of ``world`` ranks computes (one rectangle each)."""
    return [(qs, ks) for qs in chunks(mask.seqlen_q, world) for ks in chunks(mask.seqlen_k, world)]


def ring_forward_backward(
    kernel: Kernel,
    mask: AttnMask,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    world: int,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Ring attention on one process: (out, lse, (dq, dk, dv)) of ``mask``.

    Every query chunk meets every key chunk (a rectangle of the mask, prepared on its own), the
    partial results are merged by LSE, then each block's ``backward`` runs under its rows'
    merged (out, lse); dq is summed over key chunks and dk/dv over query chunks. Packed
    (S, H, D) tensors, kernels of the ``shd`` layout.
    """
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=q.dtype)
    steps = []
    for (q0, q1), (k0, k1) in ring_blocks(mask, world):
        part = kernel.prepare(mask.restrict((q0, q1), (k0, k1)), Problem.of(q[q0:q1], k[k0:k1]))
        part_out, part_lse = part.run(q[q0:q1], k[k0:k1], v[k0:k1])
        assert part_lse is not None
        merge_into(out[q0:q1], lse[:, q0:q1], part_out, part_lse)
        steps.append((part, (q0, q1), (k0, k1)))
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    for part, (q0, q1), (k0, k1) in steps:
        gq, gk, gv = part.backward(
            dout[q0:q1], q[q0:q1], k[k0:k1], v[k0:k1], out[q0:q1], lse[:, q0:q1]
        )
        dq[q0:q1] += gq
        dk[k0:k1] += gk
        dv[k0:k1] += gv
    return out, lse, (dq, dk, dv)
