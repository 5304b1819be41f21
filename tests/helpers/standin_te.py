"""Stand-in for ``transformer_engine.pytorch.DotProductAttention`` (TE 2.x, thd) in plain torch.

Its constructor and ``forward`` take their signatures from the rows of
`lcab.kernels.upstream.cudnn` (read in the TE 2.20.2 wheel, held to the installed file by
``tests/unit/test_upstream_packages.py``); the semantics are the documented ones, not lcab's
lowering, so lcab's adapter can be contract-tested on CPU (never GPU-verified):

* emulator of the mask: ``qkv_format="thd"``; sequence b owns query rows
  ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows ``cu_seqlens_kv[b]:…``, no key of another
  sequence; ``"padding"`` attends the whole sequence, ``"padding_causal"`` is top-left aligned
  (local j <= i); ``window_size=(left, right)`` keeps i - left <= j <= i + right (-1 unbounded).
  Those alignments are documented for sequences of equal query and key lengths only, so the
  stand-in asserts equal lengths whenever causal or a window applies;
* cuDNN (FusedAttention) only, as forced by ``NVTE_FUSED_ATTN=1 NVTE_FLASH_ATTN=0
  NVTE_UNFUSED_ATTN=0``: the stand-in asserts those switches and a window of (-1, 0) or
  (>= 0, >= 0) (what FusedAttention accepts); empty sequences are refused (undocumented);
* softmax attention in any float dtype, GQA by ``num_gqa_groups``, autograd through ``out``;
* returns ``out`` only, (T, Hq·D) like TE's thd output.

Every call is appended to ``CALLS``.
"""

from __future__ import annotations

import math
import os
import types
from typing import Any

import torch

from lcab.kernels.upstream import cudnn as upstream
from tests.helpers.standin_flash_attn import module
from tests.helpers.standin_rows import constructor_from_row, from_row

CALLS: list[dict[str, Any]] = []


# ----------------------------------------------------------------------------- emulator
def sequence_allowed(sq: int, sk: int, mask_type: str, window: tuple[int, int]) -> torch.Tensor:
    """(sq, sk) bool: one sequence under TE's documented mask type and window."""
    left, right = window
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if mask_type == "padding_causal":
        right = 0 if right < 0 else min(right, 0)
    if mask_type == "padding_causal" or (left, right) != (-1, -1):
        assert sq == sk, "alignment documented for equal lengths only"
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def allowed_of_call(call: dict[str, Any]) -> torch.Tensor:
    """(total_q, total_kv) bool: the block-diagonal mask a recorded call applies."""
    cq = [int(x) for x in call["cu_seqlens_q"].tolist()]
    ck = [int(x) for x in call["cu_seqlens_kv"].tolist()]
    out = torch.zeros(cq[-1], ck[-1], dtype=torch.bool)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        out[q0:q1, k0:k1] = sequence_allowed(
            q1 - q0, k1 - k0, call["attn_mask_type"], call["window_size"]
        )
    return out


# ----------------------------------------------------------------------------- the module
def _init(module: Any, call: dict[str, Any]) -> None:
    torch.nn.Module.__init__(module)
    assert call["attention_dropout"] == 0.0 and call["attention_type"] == "self"
    assert call["cp_group"] is None and call["bottom_right_diagonal"] is None
    assert call["softcap"] == 0.0 and call["softmax_type"] == "vanilla"
    module.heads, module.head_dim = call["num_attention_heads"], call["kv_channels"]
    module.groups = call["num_gqa_groups"] or module.heads
    module.scale = call["softmax_scale"] or 1.0 / math.sqrt(module.head_dim)
    module.defaults = {name: call[name] for name in ("qkv_format", "attn_mask_type", "window_size")}


class DotProductAttention(torch.nn.Module):
    """TE 2.20's ``DotProductAttention``: constructor and ``forward`` from the rows."""

    __init__ = constructor_from_row(upstream.DOT_PRODUCT_ATTENTION, _init)

    def _forward(self, call: dict[str, Any]) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) → out (T, Hq·D)."""
        for name, value in (("NVTE_FUSED_ATTN", "1"), ("NVTE_FLASH_ATTN", "0")):
            assert os.environ.get(name) == value, f"{name} must force cuDNN"
        assert os.environ.get("NVTE_UNFUSED_ATTN") == "0"
        for unused in ("attention_mask", "cu_seqlens_q_padded", "bottom_right_diagonal"):
            assert call[unused] is None, unused
        assert call["qkv_layer"] is None and call["kv_layer"] is None
        fmt = call["qkv_format"] or self.defaults["qkv_format"]
        mask_type = call["attn_mask_type"] or self.defaults["attn_mask_type"]
        window = tuple(call["window_size"] or self.defaults["window_size"] or (-1, -1))
        assert fmt == "thd" and mask_type in ("padding", "padding_causal")
        assert window == (-1, -1) or window == (-1, 0) or min(window) >= 0, "not FusedAttention"
        q, k, v = call["query_layer"], call["key_layer"], call["value_layer"]
        cu_seqlens_q, cu_seqlens_kv = call["cu_seqlens_q"], call["cu_seqlens_kv"]
        assert q.dim() == 3 and k.shape == v.shape and q.shape[1] == self.heads
        assert k.shape[1] == self.groups and q.shape[2] == self.head_dim
        for cu, total, longest in ((cu_seqlens_q, q.shape[0], call["max_seqlen_q"]),
                                   (cu_seqlens_kv, k.shape[0], call["max_seqlen_kv"])):  # fmt: skip
            assert isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1
            assert cu.device == q.device and int(cu[0]) == 0 and int(cu[-1]) == total
            assert bool((cu.diff() > 0).all()), "empty sequences are undocumented"
            assert isinstance(longest, int) and longest >= int(cu.diff().max())
        record = {"cu_seqlens_q": cu_seqlens_q.clone(), "cu_seqlens_kv": cu_seqlens_kv.clone(),
                  "attn_mask_type": mask_type, "window_size": window}  # fmt: skip
        allowed = allowed_of_call(record)
        group = self.heads // self.groups
        kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, kk) * self.scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, -1)
        out = torch.einsum("hqk,khd->qhd", probs, vv)
        CALLS.append(record)
        return out.reshape(q.shape[0], self.heads * self.head_dim)

    forward = from_row(
        upstream.DOT_PRODUCT_ATTENTION_FORWARD, lambda call: call["self"]._forward(call)
    )


class DotProductAttentionBefore2(torch.nn.Module):
    """A TE 1.x-like module: no softmax_scale, no window_size in forward."""

    def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None,
                 attention_dropout=0.0, qkv_format="sbhd", attn_mask_type="causal"):  # fmt: skip
        super().__init__()

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None,
                qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                max_seqlen_kv=None, attn_mask_type=None):  # fmt: skip
        raise AssertionError("the probe must refuse this version before any call")


def modules(**overrides: Any) -> dict[str, types.ModuleType]:
    """Stand-ins for ``transformer_engine`` and ``transformer_engine.pytorch``, by name."""
    pytorch = module(
        "transformer_engine.pytorch", **({"DotProductAttention": DotProductAttention} | overrides)
    )
    return {"transformer_engine": module("transformer_engine", pytorch=pytorch),
            "transformer_engine.pytorch": pytorch}  # fmt: skip
