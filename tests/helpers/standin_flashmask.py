"""Stand-in for ``flashmask_interface`` (torch build of FlashMask V3) in plain torch.

It implements the *documented* signature and semantics (the module's docstring; gpu_kernels.md
§3.6), not lcab's lowering, so lcab's adapter can be contract-tested on CPU (never GPU-verified):

* emulator of the mask: ``startend_row_indices`` (B, H_mask, Sk, C) int32, per key column j:
  causal C=1 masks rows >= LTS of the lower-left triangle, causal C=2 rows in [LTS, LTE) of it;
  non-causal C=2 masks rows >= LTS of the lower-left and rows < UTE of the upper-right triangle,
  C=4 rows in [LTS, LTE) of the lower-left and [UTS, UTE) of the upper-right; ``causal`` also
  masks rows i < j. The docs do not say which triangle owns the diagonal, so the emulator takes
  it as a parameter (``DIAGONAL["in_lower"]``) and the tests run both;
* square score matrices only (Sq == Sk; the triangles are not defined otherwise);
* H_mask is 1 (broadcast), Hkv (query head h uses KV head h // group) or Hq;
* softmax attention in any float dtype, GQA, autograd through ``out``; the LSE is detached;
* ``int(os.getenv("FLAGS_flash_attn_version"))`` must be 3, as in the module;
* returns ``[out, lse]`` with ``return_softmax_lse=True`` (else ``out``), LSE natural log
  (B, Hq, Sq), float32 for 16/32-bit inputs (float64 for float64 ones); on rows attending no
  key the LSE is undocumented (``EMPTY_LSE``, +inf by default).

Every call is appended to ``CALLS``.
"""

from __future__ import annotations

import math
import os
import types
from typing import Any

import torch

from tests.helpers.standin_flash_attn import module

CALLS: list[dict[str, Any]] = []
DIAGONAL = {"in_lower": True}
EMPTY_LSE = {"value": float("inf")}


# ----------------------------------------------------------------------------- emulator
def allowed(
    indices: torch.Tensor, causal: bool, seqlen_q: int, in_lower: bool | None = None
) -> torch.Tensor:
    """(H_mask, Sq, Sk) bool: what the documented column form attends (batch 0)."""
    in_lower = DIAGONAL["in_lower"] if in_lower is None else in_lower
    idx = indices[0].to(torch.int64)  # (H, Sk, C)
    sk, c = idx.shape[1], idx.shape[2]
    i = torch.arange(seqlen_q)[None, :, None]
    j = torch.arange(sk)[None, None, :]
    lower = i >= j if in_lower else i > j
    upper = ~lower

    def col(n: int) -> torch.Tensor:
        return idx[:, None, :, n]  # (H, 1, Sk)

    if causal:
        lte = col(1) if c == 2 else seqlen_q
        masked = (lower & (i >= col(0)) & (i < lte)) | (i < j)
    elif c == 2:
        masked = (lower & (i >= col(0))) | (upper & (i < col(1)))
    else:
        masked = (lower & (i >= col(0)) & (i < col(1))) | (upper & (i >= col(2)) & (i < col(3)))
    return ~masked


def allowed_of_call(call: dict[str, Any], seqlen_q: int) -> torch.Tensor:
    """The (H_mask, Sq, Sk) mask a recorded call applies."""
    return allowed(call["startend_row_indices"], call["causal"], seqlen_q)


# ----------------------------------------------------------------------------- attention
def flashmask_attention(
    query, key, value, startend_row_indices=None, *, dropout=0.0, causal=False,
    window_size=None, return_softmax_lse=False, return_seed_offset=False,
    fixed_seed_offset=None, rng_name="", training=True, name=None, softmax_scale=None,
    block_mask=None,
):  # fmt: skip
    """FlashMask V3's torch ``flashmask_attention``: q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D)."""
    assert int(os.getenv("FLAGS_flash_attn_version")) == 3  # type: ignore[arg-type]  # noqa: SIM112
    assert dropout == 0.0 and window_size is None and block_mask is None and training
    q, k, v, idx = query, key, value, startend_row_indices
    assert q.dim() == k.dim() == v.dim() == 4 and k.shape == v.shape and q.shape[0] == 1
    assert q.shape[1] == k.shape[1], "square score matrices only"
    assert q.shape[2] % k.shape[2] == 0 and q.stride(-1) == 1
    assert isinstance(idx, torch.Tensor) and idx.dtype == torch.int32 and idx.dim() == 4
    assert idx.device == q.device and idx.shape[0] == 1 and idx.shape[2] == k.shape[1]
    assert idx.shape[1] in (1, q.shape[2], k.shape[2])
    assert idx.shape[3] in ((1, 2) if causal else (2, 4))
    assert bool((idx >= 0).all()) and bool((idx <= q.shape[1]).all())
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    hq, hkv, sq = q.shape[2], k.shape[2], q.shape[1]
    ok = allowed(idx, causal, sq)  # (H_mask, Sq, Sk)
    per_q_head = ok.expand(hq, -1, -1) if ok.shape[0] == 1 else ok
    if ok.shape[0] == hkv and hkv != hq:
        per_q_head = ok.repeat_interleave(hq // hkv, 0)
    kk, vv = k[0].repeat_interleave(hq // hkv, 1), v[0].repeat_interleave(hq // hkv, 1)
    scores = torch.einsum("qhd,khd->hqk", q[0], kk) * scale
    empty = ~per_q_head.any(-1)  # (Hq, Sq)
    scores = scores.masked_fill(~(per_q_head | empty[..., None]), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(empty[..., None], 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)[None]
    lse = lse.detach().masked_fill(empty, EMPTY_LSE["value"])[None]
    lse = lse.to(torch.promote_types(q.dtype, torch.float32))
    CALLS.append(
        {"startend_row_indices": idx.clone(), "causal": causal, "scale": scale, "lse": lse}
    )
    return [out, lse] if return_softmax_lse else out


def flashmask_attention_without_lse(
    query, key, value, startend_row_indices=None, *, causal=False, softmax_scale=None
):  # fmt: skip
    """A build whose call has no return_softmax_lse."""
    raise AssertionError("the probe must refuse this build before any call")


# ----------------------------------------------------------------------------- modules
def flashmask_module(**overrides: Any) -> types.ModuleType:
    """Stand-in ``flashmask_interface``; ``overrides`` replace functions."""
    fns = {"flashmask_attention": flashmask_attention}
    return module("flashmask_interface", **(fns | overrides))
