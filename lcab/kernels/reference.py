"""The fp64 oracle: dense masked softmax attention, returning (out, lse); never timed by default.

Computed in float64 in query chunks (so memory stays ~256 MiB whatever S), with autograd, so
out, lse and dq/dk/dv of every kernel can be checked against it. `reference_rows` computes
the same for a sample of query rows, which keeps numerics checks affordable at long lengths.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from typing_extensions import override

from lcab.kernels.base import Kernel, KernelCaps, PreparedAttention, Problem
from lcab.kernels.registry import register_kernel
from lcab.masks.core import AttnMask

#: Bytes of float64 scores per query chunk.
CHUNK_BYTES = 256 << 20


def _rows_mask(mask: AttnMask, rows: torch.Tensor, head: int = 0) -> torch.Tensor:
    """Dense bool (len(rows), Sk) mask of the given query rows of one mask head."""
    ri = mask.row_intervals()
    base = head * mask.seqlen_q
    out = torch.zeros(len(rows), mask.seqlen_k + 1, dtype=torch.int32)
    for n, r in enumerate(rows.tolist()):
        lo, hi = ri.ptr[base + r], ri.ptr[base + r + 1]
        for s, e in zip(ri.starts[lo:hi].tolist(), ri.ends[lo:hi].tolist(), strict=True):
            out[n, s] += 1
            out[n, e] -= 1
    return out.cumsum(1)[:, :-1] > 0


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention of q (Sq, Hq, D), k/v (Sk, Hkv, D); allowed (Hm|1, Sq, Sk) bool.

    Rows with no allowed key give out 0 and lse -inf. Differentiable.
    """
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
    allowed = allowed.to(scores.device)  # masks are built on the host
    if allowed.shape[0] > 1:  # one mask per KV head
        allowed = allowed.repeat_interleave(q.shape[1] // allowed.shape[0], dim=0)
    scores = scores.masked_fill(~allowed, float("-inf"))
    # Rows with no key: softmax over zeros (finite gradients), then out 0 and lse -inf.
    empty = ~allowed.any(-1, keepdim=True).expand(scores.shape[0], -1, 1)
    scores = scores.masked_fill(empty, 0.0)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).masked_fill(empty, 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    return out, lse.masked_fill(empty[..., 0], float("-inf"))


class _PreparedReference(PreparedAttention):
    lse_grad = True  # plain torch ops: autograd reaches q/k/v through the LSE

    def __init__(self, mask: AttnMask, problem: Problem) -> None:
        self.mask = mask
        self.scale = 1.0 / math.sqrt(problem.head_dim)
        per_row = problem.heads_q * mask.seqlen_k * 8
        self.chunk = max(1, CHUNK_BYTES // per_row)

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = q.double(), k.double(), v.double()
        outs, lses = [], []
        for start in range(0, self.mask.seqlen_q, self.chunk):
            stop = min(start + self.chunk, self.mask.seqlen_q)
            sub = self.mask.restrict((start, stop), (0, self.mask.seqlen_k))
            allowed = sub.to_dense(max_elements=1 << 40)
            allowed = allowed.unsqueeze(0) if allowed.dim() == 2 else allowed
            out, lse = dense_attention(q[start:stop], k, v, allowed, self.scale)
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs, 0), torch.cat(lses, 1)


@register_kernel
class ReferenceKernel(Kernel):
    """fp64 dense oracle (chunked over queries); any mask, GQA, backward via autograd."""

    name = "reference"
    summary = "fp64 dense oracle for numerics checks"
    caps = KernelCaps(
        devices=frozenset({"cpu", "cuda"}),
        dtypes=frozenset({torch.float64, torch.float32, torch.bfloat16, torch.float16}),
        lowering="dense",
        backward_devices=frozenset({"cpu", "cuda"}),
        per_head_masks=True,
        stats_backward=True,
    )

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return _PreparedReference(mask, problem)


def reference_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: AttnMask,
    rows: torch.Tensor,
    dout: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """fp64 (out, lse, dq) of the given query rows only (dq needs ``dout`` for those rows).

    A query row's output and its dq depend only on that row, so a sample of rows checks a
    kernel at any length for the cost of len(rows) x Sk scores.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    heads = [_rows_mask(mask, rows, h) for h in range(mask.num_heads)]
    allowed = torch.stack(heads)
    qr = q[rows].double().detach().requires_grad_(dout is not None)
    out, lse = dense_attention(qr, k.double().detach(), v.double().detach(), allowed, scale)
    dq = None
    if dout is not None:
        (dq,) = torch.autograd.grad(out, qr, dout.double())
    return out.detach(), lse.detach(), dq


def sample_rows(seqlen: int, count: int, seed: int = 0) -> torch.Tensor:
    """``count`` distinct query rows, always including the first and last (sorted)."""
    if count >= seqlen:
        return torch.arange(seqlen)
    rng = np.random.default_rng(seed)
    picks = rng.choice(np.arange(1, seqlen - 1), size=max(count - 2, 0), replace=False)
    return torch.from_numpy(np.sort(np.concatenate([[0, seqlen - 1], picks]))).long()
