"""Block-Sparse-Attention's compiled extension (``block_sparse_attn_cuda``) emulated on the CPU.

The functions and results are those its binding defines (mit-han-lab/Block-Sparse-Attention
49d6c39, ``csrc/block_sparse_attn/flash_api.cpp``: ``fwd_block`` = ``mha_varlen_fwd_block``,
``bwd_block`` = ``mha_varlen_bwd_block``, positional as the package's Python calls them), so
`tests.helpers.real_wheels.load_bsa` can put this module in place of the real one under the
library's own ``block_sparse_attn_interface``: its custom ops, autograd function, head-type
renumbering and block-mask conversions run for real.

What the C++ gives and this keeps: ``softmax_lse`` float32 of shape (batch, heads,
max_seqlen_q) — sequence b's rows from the start of its slot, the rest never written (NaN
here, so reading them shows) — +inf on a row attending nothing, whose out is 0 (FlashAttention-2's
kernels); ``out`` in q's dtype; the backward writes the ``dq``/``dk``/``dv`` it is handed and
returns ``softmax_d`` (batch, heads, max_seqlen_q rounded to 128). The masks: a head of type 0
attends its whole sequence; of type t > 0 (the wrapper's running count) the key blocks that
``row_blockmask[b, t - 1, i]`` lists for query block i (forward), or the query blocks that
``col_blockmask[b, t - 1, j]`` lists for key block j (backward; -1 pads both), blocks of
``m_block_dim`` x ``n_block_dim`` tokens from the sequence's start. Dropout, causal, windows,
streaming heads and returned probabilities lcab never asks for: each is refused by name. The
C++ takes fp16 and bf16 only; the emulation also takes float64, for exact comparisons.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.helpers.standin_rows import flash_backward_math

CALLS: list[dict[str, Any]] = []
"""Each call: ``{"op": "fwd" | "bwd", ...}`` (tests read it)."""


def _refuse(**unsupported: Any) -> None:
    used = [name for name, value in unsupported.items() if value]
    if used:
        raise NotImplementedError(
            f"the CPU emulation of block_sparse_attn_cuda does not do {', '.join(used)}"
        )


def _allowed(cu_q, cu_k, head_mask_type, blockmask, rows_listed: bool, m: int, n: int):
    """(heads, total_q, total_k) bool from a row-wise (forward) or column-wise block list."""
    cq, ck = [int(x) for x in cu_q.tolist()], [int(x) for x in cu_k.tolist()]
    types = [int(t) for t in head_mask_type.tolist()]
    _refuse(streaming_heads=any(t < 0 for t in types))
    allowed = torch.zeros(len(types), cq[-1], ck[-1], dtype=torch.bool)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        for h, t in enumerate(types):
            if t == 0:
                allowed[h, q0:q1, k0:k1] = True
                continue
            blocks = torch.zeros(-(-(q1 - q0) // m), -(-(k1 - k0) // n), dtype=torch.bool)
            lists = blockmask[b, t - 1].cpu()
            for index, listed in enumerate(lists.tolist()):
                kept = [x for x in listed if x >= 0]
                if rows_listed:  # forward: row block `index` keeps these key blocks
                    if index < blocks.shape[0]:
                        blocks[index, [x for x in kept if x < blocks.shape[1]]] = True
                elif index < blocks.shape[1]:  # backward: key block `index` is kept by these
                    blocks[[x for x in kept if x < blocks.shape[0]], index] = True
            rows = torch.arange(q1 - q0) // m
            cols = torch.arange(k1 - k0) // n
            allowed[h, q0:q1, k0:k1] = blocks[rows][:, cols]
    return allowed


def fwd_block(q, k, v, cu_seqlens_q, cu_seqlens_k, head_mask_type, streaming_info,
              row_blockmask, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, is_causal,
              window_size_left, window_size_right, m_block_dim, n_block_dim, exact_streaming,
              return_softmax, gen):  # fmt: skip
    """``mha_varlen_fwd_block``: ``[out, softmax_lse, p, rng_state]``."""
    left = -1 if window_size_left >= max_seqlen_k else window_size_left
    right = -1 if window_size_right >= max_seqlen_k else window_size_right
    _refuse(dropout=p_dropout > 0, causal=is_causal, windows=(left, right) != (-1, -1),
            exact_streaming=exact_streaming, return_softmax=return_softmax)  # fmt: skip
    if row_blockmask is None:
        row_blockmask = torch.empty(0, 0, 0, 0, dtype=torch.int32)
    allowed = _allowed(cu_seqlens_q, cu_seqlens_k, head_mask_type, row_blockmask, True,
                       m_block_dim, n_block_dim)  # fmt: skip
    group = q.shape[1] // k.shape[1]
    wide = torch.promote_types(q.dtype, torch.float32)
    kk, vv = (t.to(wide).repeat_interleave(group, 1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.to(wide), kk) * softmax_scale
    empty = ~allowed.any(-1)
    scores = scores.masked_fill(~(allowed | empty[..., None]), float("-inf"))
    rows = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - rows[..., None]).masked_fill(empty[..., None], 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv).to(q.dtype)
    rows = rows.masked_fill(empty, float("inf"))
    batch = cu_seqlens_q.numel() - 1
    lse = torch.full((batch, q.shape[1], max_seqlen_q), float("nan"), dtype=torch.float32)
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    for b in range(batch):
        lse[b, :, : cq[b + 1] - cq[b]] = rows[:, cq[b] : cq[b + 1]].to(torch.float32)
    CALLS.append({"op": "fwd", "lse_shape": tuple(lse.shape)})
    rng_state = torch.empty(2, dtype=torch.int64)
    return [out, lse, torch.empty(0, dtype=q.dtype), rng_state]


def bwd_block(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, cu_seqlens_q, cu_seqlens_k,
              head_mask_type, streaming_info, col_blockmask, max_seqlen_q, max_seqlen_k,
              p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left,
              window_size_right, m_block_dim, n_block_dim, deterministic, gen,
              rng_state):  # fmt: skip
    """``mha_varlen_bwd_block``: writes dq, dk, dv; ``[dq, dk, dv, softmax_d]``."""
    left = -1 if window_size_left >= max_seqlen_k else window_size_left
    right = -1 if window_size_right >= max_seqlen_k else window_size_right
    _refuse(dropout=p_dropout > 0, causal=is_causal, windows=(left, right) != (-1, -1))
    if col_blockmask is None:
        col_blockmask = torch.empty(0, 0, 0, 0, dtype=torch.int32)
    allowed = _allowed(cu_seqlens_q, cu_seqlens_k, head_mask_type, col_blockmask, False,
                       m_block_dim, n_block_dim)  # fmt: skip
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    heads, group = q.shape[1], q.shape[1] // k.shape[1]
    lse = torch.empty(heads, q.shape[0], dtype=torch.float64)
    for b in range(len(cq) - 1):
        lse[:, cq[b] : cq[b + 1]] = softmax_lse[b, :, : cq[b + 1] - cq[b]].to(torch.float64)
    dq = dq_ if dq_ is not None else torch.empty_like(q)
    dk = dk_ if dk_ is not None else torch.empty_like(k)
    dv = dv_ if dv_ is not None else torch.empty_like(v)
    dk.zero_()
    dv.zero_()
    for h in range(heads):  # each query head under its own mask; KV heads sum their group
        kv = h // group
        gq, gk, gv = flash_backward_math(
            dout[:, h : h + 1], q[:, h : h + 1], k[:, kv : kv + 1], v[:, kv : kv + 1],
            out[:, h : h + 1], lse[h : h + 1], allowed[h], softmax_scale,
        )  # fmt: skip
        dq[:, h : h + 1] = gq.to(dq.dtype)
        dk[:, kv : kv + 1] += gk.to(dk.dtype)
        dv[:, kv : kv + 1] += gv.to(dv.dtype)
    rounded = -(-max_seqlen_q // 128) * 128
    softmax_d = torch.zeros(len(cq) - 1, heads, rounded, dtype=torch.float32)
    delta = (dout.to(torch.float64) * out.to(torch.float64)).sum(-1).t()  # (heads, total_q)
    for b in range(len(cq) - 1):
        softmax_d[b, :, : cq[b + 1] - cq[b]] = delta[:, cq[b] : cq[b + 1]].to(torch.float32)
    CALLS.append({"op": "bwd"})
    return [dq, dk, dv, softmax_d]
