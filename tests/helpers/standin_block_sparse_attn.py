"""Stand-in for ``block_sparse_attn`` (mit-han-lab Block-Sparse-Attention v0.0.2) in plain torch.

Its signature is the row of `lcab.kernels.upstream.block_sparse_attn` (read at 49d6c39); its
semantics are the library's ``block_sparse_attn_interface.py``, ``flash_api.cpp`` and
``flash_blockmask.h``, not lcab's lowering, so lcab's adapter can be contract-tested on CPU
(never GPU-verified):

* argument checks of the wrapper and ``mha_varlen_fwd_block``: int32 contiguous
  ``cu_seqlens``, ``head_mask_type`` (Hq,) and ``streaming_info`` (2 Hq,) on the inputs'
  device; the wrapper renumbers the ``1`` entries of ``head_mask_type`` into a running count
  and asserts ``base_blockmask.shape[1]`` equals their number; ``base_blockmask`` is
  (B, n_blocksparse_heads, ceil(max_seqlen_q/128), ceil(max_seqlen_k/128));
* emulator of the mask: in sequence b, query head h of type t attends everything (t = 0), or
  (t >= 1) key block j from query block i iff ``base_blockmask[b, t - 1, i, j]``, blocks of
  128 tokens counted from the sequence start, the last one cut at the sequence end; keys of
  other sequences never; streaming heads (t < 0), ``is_causal``, dropout and exact streaming are
  not emulated (lcab never passes them: asserted);
* softmax attention, any float dtype (float64 for exact comparisons), query head h reads KV
  head ``h // (Hq / Hkv)``, autograd through ``out``; the LSE is detached (the library's backward
  ignores its gradient);
* returns ``(out, softmax_lse, S_dmask)`` with ``return_attn_probs=True``, else ``out``;
  ``softmax_lse`` natural log, (B, Hq, max_seqlen_q), float32 for 16/32-bit inputs (float64 for
  float64 inputs, so the contract test can be exact), +inf on rows attending nothing (FA2 code),
  out 0 there.

Every call is appended to ``CALLS`` (the renumbered head types, the keywords, the raw LSE).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lcab.kernels.upstream import block_sparse_attn as upstream
from tests.helpers.standin_flash_attn import module
from tests.helpers.standin_rows import from_row

CALLS: list[dict[str, Any]] = []
BLOCK = 128


# ----------------------------------------------------------------------------- emulator
def renumber_head_types(head_mask_type: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The wrapper's renumbering: the k-th entry equal to 1 becomes k; others unchanged."""
    ones = head_mask_type == 1
    count = torch.cumsum(ones.to(torch.int64), dim=-1).to(head_mask_type.dtype)
    return torch.where(ones, count, head_mask_type), int(ones.sum())


def sequence_allowed(blockmask: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """(sq, sk) bool: one block-sparse head of one sequence (128x128 tiles, last ones cut)."""
    rows = torch.arange(sq) // BLOCK
    cols = torch.arange(sk) // BLOCK
    return blockmask[rows][:, cols].bool()


def allowed_of_call(call: dict[str, Any]) -> torch.Tensor:
    """(Hq, total_q, total_k) bool: the mask a recorded call applies, per query head."""
    kw = call["kwargs"]
    cq = [int(x) for x in kw["cu_seqlens_q"].tolist()]
    ck = [int(x) for x in kw["cu_seqlens_k"].tolist()]
    types = [int(t) for t in call["head_types"].tolist()]
    out = torch.zeros(len(types), cq[-1], ck[-1], dtype=torch.bool)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        for h, t in enumerate(types):
            assert t >= 0, "streaming heads are not emulated"
            if t == 0:
                out[h, q0:q1, k0:k1] = True
            else:
                blocks = kw["base_blockmask"][b, t - 1]
                out[h, q0:q1, k0:k1] = sequence_allowed(blocks, q1 - q0, k1 - k0)
    return out


# ----------------------------------------------------------------------------- attention
def _check(kw: dict[str, Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    assert q.dim() == k.dim() == v.dim() == 3 and k.shape == v.shape
    assert q.shape[2] == k.shape[2] and q.shape[1] % k.shape[1] == 0
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    hq = q.shape[1]
    for name in ("cu_seqlens_q", "cu_seqlens_k", "head_mask_type", "streaming_info"):
        t = kw[name]
        assert isinstance(t, torch.Tensor) and t.dtype == torch.int32, name
        assert t.device == q.device and t.is_contiguous() and t.dim() == 1, name
    assert kw["head_mask_type"].shape == (hq,)
    assert kw["streaming_info"].shape == (2 * hq,)
    for cu, total, longest in (
        (kw["cu_seqlens_q"], q.shape[0], kw["max_seqlen_q_"]),
        (kw["cu_seqlens_k"], k.shape[0], kw["max_seqlen_k_"]),
    ):
        assert int(cu[0]) == 0 and int(cu[-1]) == total and bool((cu.diff() >= 0).all())
        assert isinstance(longest, int) and longest >= int(cu.diff().max())
    assert len(kw["cu_seqlens_q"]) == len(kw["cu_seqlens_k"])


def _block_sparse_attn_func(given: dict[str, Any]) -> Any:
    """``block_sparse_attn_func`` (the row's signature, v0.0.2 at 49d6c39), computed densely."""
    q, k, v = given["q"], given["k"], given["v"]
    cu_seqlens_q, cu_seqlens_k = given["cu_seqlens_q"], given["cu_seqlens_k"]
    head_mask_type, streaming_info = given["head_mask_type"], given["streaming_info"]
    base_blockmask, max_seqlen_q_ = given["base_blockmask"], given["max_seqlen_q_"]
    max_seqlen_k_, softmax_scale = given["max_seqlen_k_"], given["softmax_scale"]
    p_dropout, is_causal, exact_streaming = (
        given["p_dropout"], given["is_causal"], given["exact_streaming"]
    )  # fmt: skip
    kw = {
        "cu_seqlens_q": cu_seqlens_q,
        "cu_seqlens_k": cu_seqlens_k,
        "head_mask_type": head_mask_type,
        "streaming_info": streaming_info,
        "base_blockmask": base_blockmask,
        "max_seqlen_q_": max_seqlen_q_,
        "max_seqlen_k_": max_seqlen_k_,
    }
    _check(kw, q, k, v)
    assert p_dropout == 0.0 and not is_causal and not exact_streaming
    types, n_sparse = renumber_head_types(head_mask_type)
    if base_blockmask is not None:
        assert base_blockmask.shape[1] == n_sparse  # the wrapper's own assertion
        batch = len(cu_seqlens_q) - 1
        shape = (batch, n_sparse, -(-max_seqlen_q_ // BLOCK), -(-max_seqlen_k_ // BLOCK))
        assert tuple(base_blockmask.shape) == shape, (tuple(base_blockmask.shape), shape)
        assert base_blockmask.device == q.device
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    call = {"kwargs": kw, "head_types": types.cpu(), "scale": scale}
    allowed = allowed_of_call(call).to(q.device)  # (Hq, total_q, total_k)
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
    empty = ~allowed.any(-1)  # (Hq, total_q)
    keep = allowed | empty[..., None]  # empty rows: a harmless softmax, zeroed below
    scores = scores.masked_fill(~keep, float("-inf"))
    lse_rows = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse_rows[..., None]).masked_fill(empty[..., None], 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    lse_rows = lse_rows.detach().masked_fill(empty, float("inf"))
    # (B, Hq, max_seqlen_q): sequence b's rows at the start of its slot
    lse_dtype = torch.promote_types(q.dtype, torch.float32)
    batch = len(cu_seqlens_q) - 1
    lse = torch.full((batch, q.shape[1], max_seqlen_q_), float("inf"), dtype=lse_dtype)
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    for b in range(batch):
        lse[b, :, : cq[b + 1] - cq[b]] = lse_rows[:, cq[b] : cq[b + 1]]
    call["lse"] = lse
    CALLS.append(call)
    return (out, lse, torch.empty(0)) if given["return_attn_probs"] else out


block_sparse_attn_func = from_row(upstream.BLOCK_SPARSE_ATTN_FUNC, _block_sparse_attn_func)


def block_sparse_attn_func_without_lse(
    q, k, v, cu_seqlens_q, cu_seqlens_k, head_mask_type, streaming_info, base_blockmask,
    max_seqlen_q_, max_seqlen_k_, p_dropout, deterministic=False, softmax_scale=None,
    is_causal=False, exact_streaming=False,
):  # fmt: skip
    """A hypothetical build whose function has no ``return_attn_probs`` keyword."""
    raise AssertionError("the probe must refuse this build before any call")


def bsa_module(version: str | None = "0.0.2", **overrides: Any):
    """Stand-in ``block_sparse_attn``; ``overrides`` replace functions."""
    mod = module(
        "block_sparse_attn", **({"block_sparse_attn_func": block_sparse_attn_func} | overrides)
    )
    if version is not None:
        mod.__version__ = version
    return mod
