"""Stand-in for ``fastvideo_kernel.block_sparse_attn`` (0.3.x) in plain torch.

Its two ops take their signatures from the rows of `lcab.kernels.upstream.vsa` (read in the
fastvideo-kernel 0.3.5 sdist) and implement the semantics of those sources (0.3.2 and 0.3.5),
not lcab's lowering, so the sparse_vsa adapters can be contract-tested on CPU (never
GPU-verified):

* emulator of the mask: query row i (in 64-row block qb) attends key j iff j's 64-key block is
  one of the first ``q2k_num[0, h, qb]`` entries of ``q2k_idx[0, h, qb]`` and
  ``j mod 64 < variable_block_sizes[j // 64]``;
* preconditions asserted as the library states or checks them: (1, H, S, D) q/k/v with S a
  multiple of 64, Hq == Hkv, int32 index tensors of the documented shapes, block ids in range;
  the TK op additionally needs ``q2k_num >= 1`` (its forward reads entry ``q2k_num - 1``);
* softmax attention with scale 1/sqrt(D), any float dtype (float64 for exact comparisons),
  autograd through ``out``; the LSE is returned detached (the library drops its gradient):
  Triton's in log2 units, (B, H, S), and rows without keys give out 0 and LSE -inf; TK's as
  ``-sqrt(D) * lse`` (natural log), (B, H, S, 1).

Every call is appended to ``CALLS`` (which op, the index tensors, the raw LSE).
"""

from __future__ import annotations

import importlib.machinery
import math
import types
from typing import Any

import torch

from lcab.kernels.upstream import vsa as upstream
from tests.helpers.standin_rows import from_row

CALLS: list[dict[str, Any]] = []
BLOCK = 64


def allowed_of_call(call: dict[str, Any]) -> torch.Tensor:
    """(H, Sq_padded, Sk_padded) bool: what a recorded call attends (the documented rule)."""
    idx, num, sizes = call["q2k_idx"][0], call["q2k_num"][0], call["variable_block_sizes"]
    heads, n_q, _ = idx.shape
    n_k = len(sizes)
    blocks = torch.zeros(heads, n_q, n_k, dtype=torch.bool)
    for h in range(heads):
        for qb in range(n_q):
            blocks[h, qb, idx[h, qb, : int(num[h, qb])].long()] = True
    valid_key = torch.arange(BLOCK)[None, :] < sizes[:, None].long()  # (n_k, 64)
    allowed = blocks.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)
    return allowed & valid_key.reshape(1, 1, -1)


def _check(q, k, v, q2k_idx, q2k_num, sizes, thunderkittens: bool) -> None:
    assert q.dim() == k.dim() == v.dim() == 4 and q.shape[0] == 1, (q.shape, k.shape)
    assert k.shape == v.shape and q.shape[1] == k.shape[1], "Hq == Hkv"
    assert q.shape[-1] == k.shape[-1]
    assert q.shape[2] % BLOCK == 0 and k.shape[2] % BLOCK == 0, "S padded to 64"
    n_q, n_k = q.shape[2] // BLOCK, k.shape[2] // BLOCK
    for t in (q2k_idx, q2k_num, sizes):
        assert t.dtype == torch.int32 and t.is_contiguous() and t.device == q.device
    assert q2k_idx.dim() == 4 and tuple(q2k_idx.shape[:3]) == (1, q.shape[1], n_q)
    assert tuple(q2k_num.shape) == (1, q.shape[1], n_q)
    assert tuple(sizes.shape) == (n_k,) and bool(((sizes >= 1) & (sizes <= BLOCK)).all())
    assert bool((q2k_num >= 0).all()) and bool((q2k_num <= q2k_idx.shape[-1]).all())
    if thunderkittens:
        assert bool((q2k_num >= 1).all()), "TK reads q2k_idx[q2k_num - 1]: needs q2k_num >= 1"
    for h in range(q.shape[1]):
        for qb in range(n_q):
            used = q2k_idx[0, h, qb, : int(q2k_num[0, h, qb])]
            assert bool(((used >= 0) & (used < n_k)).all()), "block id out of range"
            assert len(set(used.tolist())) == len(used), "a block listed twice"


def _attend(q, k, v, q2k_idx, q2k_num, sizes, thunderkittens: bool, op: str):
    _check(q, k, v, q2k_idx, q2k_num, sizes, thunderkittens)
    call = {
        "op": op,
        "q2k_idx": q2k_idx.clone(),
        "q2k_num": q2k_num.clone(),
        "variable_block_sizes": sizes.clone(),
        "shapes": (tuple(q.shape), tuple(k.shape)),
    }
    allowed = allowed_of_call(call)  # (H, Sq, Sk)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("hqd,hkd->hqk", q[0], k[0]) * scale
    empty = ~allowed.any(-1)
    scores = scores.masked_fill(~(allowed | empty[..., None]), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(empty[..., None], 0.0)
    out = torch.einsum("hqk,hkd->hqd", probs, v[0]).unsqueeze(0)
    lse = lse.detach().to(torch.promote_types(q.dtype, torch.float32)).unsqueeze(0)
    if thunderkittens:
        raw = (-math.sqrt(q.shape[-1]) * lse).unsqueeze(-1)  # (B, H, S, 1)
    else:
        raw = (lse / math.log(2.0)).masked_fill(empty[None], float("-inf"))  # (B, H, S)
    call["lse"] = raw
    CALLS.append(call)
    return out, raw


def _triton(call: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton op: (out (B, H, S, D), M (B, H, S) log2)."""
    q, k, v = call["q"], call["k"], call["v"]
    return _attend(q, k, v, *(call[name] for name in INDICES), False, "triton")


def _sm90(call: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ThunderKittens op: (out (B, H, S, D), lse (B, H, S, 1) = -sqrt(D)·ln-LSE)."""
    q, k, v = call["q_padded"], call["k_padded"], call["v_padded"]
    return _attend(q, k, v, *(call[name] for name in INDICES), True, "tk")


INDICES = ("q2k_idx", "q2k_num", "variable_block_sizes")
block_sparse_attn_triton = from_row(upstream.BLOCK_SPARSE_ATTN_TRITON, _triton)
block_sparse_attn_sm90 = from_row(upstream.BLOCK_SPARSE_ATTN_SM90, _sm90)


def block_sparse_attn_triton_with_block_size(
    q, k, v, q2k_idx, q2k_num, variable_block_sizes, block_size
):
    """An op of another API generation that also requires the block size."""
    raise AssertionError("the probe must refuse this version before any call")


def sm90_ops_loaded() -> tuple[Any, Any]:
    """``_get_sm90_ops`` when the compiled TK extension loaded."""
    return object(), object()


def sm90_ops_missing() -> tuple[Any, Any]:
    """``_get_sm90_ops`` when ``fastvideo_kernel._C`` failed to import."""
    return None, None


def modules(**overrides: Any) -> dict[str, types.ModuleType]:
    """``fastvideo_kernel`` and its ``block_sparse_attn`` module; ``overrides`` replace attrs."""
    attrs = {
        "block_sparse_attn_triton": block_sparse_attn_triton,
        "block_sparse_attn_sm90": block_sparse_attn_sm90,
        "_get_sm90_ops": sm90_ops_loaded,
    } | overrides
    parent = types.ModuleType("fastvideo_kernel")
    parent.__spec__ = importlib.machinery.ModuleSpec("fastvideo_kernel", None, is_package=True)
    parent.__path__ = []
    child = types.ModuleType("fastvideo_kernel.block_sparse_attn")
    child.__spec__ = importlib.machinery.ModuleSpec("fastvideo_kernel.block_sparse_attn", None)
    for name, value in attrs.items():
        if value is not None:
            setattr(child, name, value)
    parent.block_sparse_attn = child  # type: ignore[attr-defined]
    return {"fastvideo_kernel": parent, "fastvideo_kernel.block_sparse_attn": child}
