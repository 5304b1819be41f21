"""The fp64 oracle: dense masked softmax attention, returning (out, lse); never timed by default.

Computed in query chunks (memory ~256 MiB whatever S), with autograd. `streamed_rows` computes
out, lse and dq for sampled rows with K/V streamed in chunks, for checks at CP lengths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from typing_extensions import override

from lcab.kernels.base import Kernel, Output, PreparedAttention, Problem, torch_caps
from lcab.kernels.registry import register_kernel
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

#: Bytes of float64 scores per query chunk.
CHUNK_BYTES = 256 << 20
#: Bytes of one key chunk of the streamed row reference (scores and K/V).
STREAM_CHUNK_BYTES = 64 << 20


class RowWindow:
    """The attended intervals of some query rows, cut into dense key chunks on demand."""

    def __init__(self, mask: AttnMask, rows: torch.Tensor) -> None:
        self.rows = rows.to("cpu", torch.long)
        intervals = mask.row_intervals()
        self.seqlen_q = mask.seqlen_q
        self._per_head = []
        for head in range(mask.num_heads):
            flat = self.rows.numpy() + head * mask.seqlen_q
            lo, hi = intervals.ptr[flat], intervals.ptr[flat + 1]
            counts = hi - lo
            owner = np.repeat(np.arange(len(flat)), counts)
            picks = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
            self._per_head.append(
                (
                    torch.from_numpy(owner),
                    torch.from_numpy(intervals.starts[picks].astype(np.int64)),
                    torch.from_numpy(intervals.ends[picks].astype(np.int64)),
                )
            )

    def allowed(self, head: int, start: int, stop: int) -> torch.Tensor:
        """Dense bool (len(rows), stop - start): which of keys ``start:stop`` each row attends."""
        owner, first, end = self._per_head[head]
        width = stop - start
        lo = (first - start).clamp(0, width)
        hi = (end - start).clamp(0, width)
        keep = lo < hi
        edges = torch.zeros(len(self.rows), width + 1, dtype=torch.int32)
        ones = torch.ones(int(keep.sum()), dtype=torch.int32)
        edges.index_put_((owner[keep], lo[keep]), ones, accumulate=True)
        edges.index_put_((owner[keep], hi[keep]), -ones, accumulate=True)
        return edges.cumsum(1)[:, :-1] > 0


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention of q (Sq, Hq, D), k/v (Sk, Hkv, D); allowed (Hm|1, Sq, Sk) bool.

    Query heads are grouped under their K/V head, never K/V repeated; differentiable.
    """
    sq, hq, d = q.shape
    hkv = k.shape[1]
    grouped = q.reshape(sq, hkv, hq // hkv, d)
    scores = torch.einsum("qhgd,khd->hgqk", grouped, k) * scale
    allowed = allowed.to(scores.device)  # masks are built on the host
    allowed = allowed.unsqueeze(1)  # (Hm|1, 1, Sq, Sk): one mask per K/V head, or one for all
    scores = scores.masked_fill(~allowed, float("-inf"))
    # Rows with no key: softmax over zeros (finite gradients), then out 0 and lse -inf.
    empty = ~allowed.any(-1, keepdim=True).expand(*scores.shape[:-1], 1)
    scores = scores.masked_fill(empty, 0.0)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).masked_fill(empty, 0.0)
    out = torch.einsum("hgqk,khd->qhgd", probs, v).reshape(sq, hq, d)
    lse = lse.masked_fill(empty[..., 0], float("-inf"))
    return out, lse.reshape(hq, sq)


class _PreparedReference(PreparedAttention):
    lse_grad = True  # plain torch ops: autograd reaches q/k/v through the LSE

    def __init__(self, mask: AttnMask, problem: Problem) -> None:
        self.mask = mask
        self.scale = 1.0 / math.sqrt(problem.head_dim)
        per_row = problem.heads_q * mask.seqlen_k * 8
        self.chunk = max(1, CHUNK_BYTES // per_row)

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
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
    colour = "#7f7f7f"
    summary = "fp64 dense oracle for numerics checks"
    caps = torch_caps("dense")

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return _PreparedReference(mask, problem)


KeyChunks: TypeAlias = "Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]"
"""``(start, stop) -> (k, v)`` of keys ``start:stop``: how the streamed reference sees K/V."""


def streamed_rows(
    q_rows: torch.Tensor,
    rows: torch.Tensor,
    mask: AttnMask,
    keys: KeyChunks,
    heads_kv: int,
    dout_rows: torch.Tensor | None = None,
    chunk_bytes: int = STREAM_CHUNK_BYTES,
    align: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """fp64 (out, lse, dq) of query rows ``rows`` (their q in ``q_rows``), keys streamed.

    K/V arrive in key chunks from ``keys`` (drawn, not stored), each key once (chunk widths are
    multiples of ``align``, the caller's unit of drawing). One pass: an online softmax, and
    dq = scale·Σ p_k (dp_k − δ) k_k accumulated as Σ p dp k, Σ p k and Σ p dp under the same
    running rescaling, combined at the end.
    """
    rows = rows.to("cpu", torch.long)
    n, hq, d = q_rows.shape
    scale = 1.0 / math.sqrt(d)
    window = RowWindow(mask, rows)
    q64 = q_rows.detach().double()
    device = q64.device
    hkv = heads_kv
    group = hq // hkv
    qg = q64.reshape(n, hkv, group, d)
    dog = None
    if dout_rows is not None:
        dog = dout_rows.detach().double().to(device).reshape(n, hkv, group, d).permute(1, 2, 0, 3)
    # per key: four fp64 score-sized blocks per query row and head, and K and V as drawn
    # (up to fp32) and in fp64
    per_key = hq * n * 8 * 4 + hkv * d * (4 + 8) * 2
    width = max(1, chunk_bytes // per_key)
    width = max(align, width // align * align)  # whole blocks: none drawn twice
    top = torch.full((hkv, group, n), float("-inf"), dtype=torch.float64, device=device)
    total = torch.zeros_like(top)
    acc = torch.zeros((hkv, group, n, d), dtype=torch.float64, device=device)
    if dog is not None:  # sum p dp k, sum p k (per row and head) and sum p dp (per row)
        grad_k, prob_k, prob_dp = (
            torch.zeros_like(acc),
            torch.zeros_like(acc),
            torch.zeros_like(top),
        )
    for a in range(0, mask.seqlen_k, width):
        b = min(a + width, mask.seqlen_k)
        k, v = keys(a, b)
        k64, v64 = k.detach().to(device, torch.float64), v.detach().to(device, torch.float64)
        scores = torch.einsum("nhgd,khd->hgnk", qg, k64) * scale
        allowed = torch.stack([window.allowed(h, a, b) for h in range(mask.num_heads)])
        allowed = allowed.to(device).unsqueeze(1)  # (Hm|1, 1, n, b - a)
        scores = scores.masked_fill(~allowed, float("-inf"))
        new_top = torch.maximum(top, scores.amax(-1))
        shift = torch.where(torch.isinf(new_top), 0.0, new_top)
        probs = torch.exp(scores - shift.unsqueeze(-1))
        decay = torch.exp(top - shift)
        total = total * decay + probs.sum(-1)
        acc = acc * decay.unsqueeze(-1) + torch.einsum("hgnk,khd->hgnd", probs, v64)
        if dog is not None:
            weighted = probs * torch.einsum("hgnd,khd->hgnk", dog, v64)  # p * dp
            grad_k = grad_k * decay.unsqueeze(-1) + torch.einsum("hgnk,khd->hgnd", weighted, k64)
            prob_k = prob_k * decay.unsqueeze(-1) + torch.einsum("hgnk,khd->hgnd", probs, k64)
            prob_dp = prob_dp * decay + weighted.sum(-1)
            del weighted
        top = new_top
        del scores, k64, v64, probs  # one chunk alive at a time, not two
    empty = total == 0
    lse = torch.where(empty, float("-inf"), torch.where(empty, 0.0, top) + total.log())
    norm = total.clamp_min(1e-300)
    out = torch.where(empty.unsqueeze(-1), 0.0, acc / norm.unsqueeze(-1))
    dq = None
    if dog is not None:
        delta = (prob_dp / norm).unsqueeze(-1)
        dq_g = (grad_k - delta * prob_k) / norm.unsqueeze(-1)
        dq = (dq_g * scale).permute(2, 0, 1, 3).reshape(n, hq, d)
    return out.permute(2, 0, 1, 3).reshape(n, hq, d), lse.reshape(hq, n), dq


def sample_rows(seqlen: int, count: int, seed: int = 0) -> torch.Tensor:
    """``count`` distinct query rows, always including the first and last (sorted)."""
    if count >= seqlen:
        return torch.arange(seqlen)
    rng = np.random.default_rng(seed)
    picks = rng.choice(np.arange(1, seqlen - 1), size=max(count - 2, 0), replace=False)
    return torch.from_numpy(np.sort(np.concatenate([[0, seqlen - 1], picks]))).long()
