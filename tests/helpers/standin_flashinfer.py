"""Stand-in for ``flashinfer``'s block-sparse wrappers in plain torch (documented semantics only).

Constructors, ``plan`` and ``run`` take their signatures from the rows of
`lcab.kernels.upstream.flashinfer` (read in the 0.7.2.post1 wheel, held to the installed package
by ``tests/unit/test_upstream_packages.py``): a call the real wrappers reject fails here too.
They implement what ``flashinfer/sparse.py`` says, not lcab's lowering, so the adapter is
contract-tested on CPU (never GPU-verified):

* ``BlockSparseAttentionWrapper(float_workspace_buffer, backend="auto")``; ``plan(indptr,
  indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None, ...)``: a BSR matrix of
  MB = ceil(M / R) row blocks; row block i attends column blocks ``indices[indptr[i]:
  indptr[i+1]]`` (N divisible by C); ``mask`` (nnz, R, C) bool restricts each block to its True
  elements (a shorter last row block uses its first rows); without a mask, ``causal=True``
  applies FlashInfer's bottom-right causal rule to each row block over its gathered keys (row r
  of qo_len rows sees gathered key j <= r + kv_len - qo_len); ``run(q, k, v, return_lse=True)``
  with q (M, Hq, D), k/v (N, Hkv, D) → out (M, Hq, D), lse (M, Hq);
* ``VariableBlockSparseAttentionWrapper``; ``plan(block_mask_map (Hkv, MB, NB) bool,
  block_row_sz (Hkv, MB), block_col_sz (Hkv, NB) int32, ...)``: per KV head, row block i (sizes
  summing to the query length) attends column block j iff the map says so; ``run`` with q
  (Hq, S, D), k/v (Hkv, S, D) → out (Hq, S, D), lse (Hq, S);
* LSE in **log2** units (FlashInfer's kernels compute in base 2), float32 for 16/32-bit inputs
  (float64 for float64 inputs, so comparisons can be exact); GQA by query groups; no autograd.
  A row attending nothing gets out 0 and lse -inf here; the library's value is undocumented, and
  the adapter must not depend on it (the tests make it NaN to check that).

Every ``plan`` and ``run`` is appended to ``CALLS``.
"""

from __future__ import annotations

import importlib.machinery
import math
import types
from typing import Any

import torch

from lcab.kernels.upstream import flashinfer as upstream
from tests.helpers.standin_rows import constructor_from_row, from_row

CALLS: list[dict[str, Any]] = []
#: What the stand-in writes on rows attending nothing (the library's value is undocumented).
EMPTY_ROW_VALUE = {"out": float("nan"), "lse": float("nan")}


# ----------------------------------------------------------------------------- emulators
def bsr_allowed(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    M: int,
    N: int,
    R: int,
    C: int,
    mask: torch.Tensor | None,
    causal: bool = False,
) -> torch.Tensor:
    """(M, N) bool: the BSR pattern with its per-block element masks or causal flag."""
    allowed = torch.zeros(M, N, dtype=torch.bool)
    ptr, cols = indptr.cpu().tolist(), indices.cpu().tolist()
    for i in range(len(ptr) - 1):
        r0, r1 = i * R, min((i + 1) * R, M)
        qo_len, kv_len = r1 - r0, (ptr[i + 1] - ptr[i]) * C
        for n, e in enumerate(range(ptr[i], ptr[i + 1])):
            c0 = cols[e] * C
            block = torch.ones(R, C, dtype=torch.bool) if mask is None else mask[e].cpu()
            if causal and mask is None:  # gathered key index n*C + c <= r + kv_len - qo_len
                r, c = torch.arange(R)[:, None], torch.arange(C)[None, :]
                block = n * C + c <= r + kv_len - qo_len
            allowed[r0:r1, c0 : c0 + C] = block[: r1 - r0]
    return allowed


def variable_allowed(
    block_mask_map: torch.Tensor, block_row_sz: torch.Tensor, block_col_sz: torch.Tensor
) -> torch.Tensor:
    """(Hkv, Sq, Sk) bool: per KV head, the variable-size blocks the map selects."""
    heads = block_mask_map.shape[0]
    sq, sk = int(block_row_sz[0].sum()), int(block_col_sz[0].sum())
    allowed = torch.zeros(heads, sq, sk, dtype=torch.bool)
    for h in range(heads):
        q_cu = [0, *torch.cumsum(block_row_sz[h].cpu(), 0).tolist()]
        k_cu = [0, *torch.cumsum(block_col_sz[h].cpu(), 0).tolist()]
        for i, j in block_mask_map[h].cpu().nonzero().tolist():
            allowed[h, q_cu[i] : q_cu[i + 1], k_cu[j] : k_cu[j + 1]] = True
    return allowed


# ----------------------------------------------------------------------------- attention
def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (Hq, Sq, D), k/v (Hkv, Sk, D), allowed (Hkv, Sq, Sk) → out (Hq, Sq, D), lse2 (Hq, Sq)."""
    group = q.shape[0] // k.shape[0]
    kk, vv = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    ok = allowed.repeat_interleave(group, 0).to(q.device)
    scores = torch.einsum("hqd,hkd->hqk", q, kk) * scale
    scores = scores.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,hkd->hqd", probs, vv)
    empty = ~ok.any(-1)
    out = out.masked_fill(empty[..., None], EMPTY_ROW_VALUE["out"])
    lse2 = (lse / math.log(2.0)).masked_fill(empty, EMPTY_ROW_VALUE["lse"])
    return out.to(q.dtype), lse2.to(torch.promote_types(q.dtype, torch.float32))


def _dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    return getattr(torch, value) if isinstance(value, str) else value


def _init(wrapper: Any, call: dict[str, Any]) -> None:
    assert call["float_workspace_buffer"].dtype == torch.uint8
    wrapper.backend, wrapper.planned = call["backend"], None


def _unused(call: dict[str, Any], *names: str) -> None:
    """Arguments lcab never passes keep their default None (nothing else is emulated)."""
    for name in names:
        assert call[name] is None, name


class BlockSparseAttentionWrapper:
    """Stand-in of the BSR wrapper; constructor, ``plan`` and ``run`` have the rows' signatures."""

    planned: dict[str, Any] | None
    __init__ = constructor_from_row(upstream.BSR_INIT, _init)

    def _plan(self, call: dict[str, Any]) -> None:
        indptr, indices, mask = call["indptr"], call["indices"], call["mask"]
        m, n, r, c = call["M"], call["N"], call["R"], call["C"]
        num_qo_heads, num_kv_heads = call["num_qo_heads"], call["num_kv_heads"]
        _unused(call, "packed_mask", "block_mask", "kv_block_lens", "q2k_indices", "q2k_num")
        assert indptr.dtype == torch.int32 and indices.dtype == torch.int32
        assert n % c == 0, "N must be divisible by C"
        assert len(indptr) == -(-m // r) + 1 and int(indptr[0]) == 0
        assert int(indptr[-1]) == len(indices)
        if int(indices.max().item()) * c > n:  # as the library: fails on nnz = 0 too
            raise ValueError("indices out of bound")
        assert num_qo_heads % num_kv_heads == 0
        if mask is not None:
            assert mask.dtype == torch.bool and tuple(mask.shape) == (len(indices), r, c)
        self.planned = {
            "wrapper": "bsr",
            "indptr": indptr.clone(),
            "indices": indices.clone(),
            "M": m, "N": n, "R": r, "C": c,
            "mask": None if mask is None else mask.clone(),
            "causal": call["causal"],
            "heads": (num_qo_heads, num_kv_heads, call["head_dim"]),
            "sm_scale": call["sm_scale"],
            "dtypes": tuple(_dtype(call[f"{x}_data_type"]) for x in ("q", "kv", "o")),
        }  # fmt: skip
        CALLS.append(self.planned)

    def _run(self, call: dict[str, Any]) -> Any:
        q, k, v, p = call["q"], call["k"], call["v"], self.planned
        assert p is not None, "plan first"
        _unused(call, "scale_q", "scale_k", "scale_v", "out", "lse")
        hq, hkv, d = p["heads"]
        assert q.shape == (p["M"], hq, d) and k.shape == v.shape == (p["N"], hkv, d)
        assert q.dtype == p["dtypes"][0]
        allowed = bsr_allowed(
            p["indptr"], p["indices"], p["M"], p["N"], p["R"], p["C"], p["mask"], p["causal"]
        )
        scale = p["sm_scale"] if p["sm_scale"] is not None else 1.0 / math.sqrt(d)
        o, lse2 = attend(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            allowed.expand(hkv, -1, -1),
            scale,
        )
        o, lse2 = o.transpose(0, 1).to(p["dtypes"][2]), lse2.t().contiguous()  # (M, Hq)
        CALLS.append({"wrapper": "bsr", "run": True, "lse": lse2})
        return (o, lse2) if call["return_lse"] else o

    plan = from_row(upstream.BSR_PLAN, lambda call: call["self"]._plan(call))
    run = from_row(upstream.BSR_RUN, lambda call: call["self"]._run(call))


class VariableBlockSparseAttentionWrapper:
    """Stand-in of the variable-block wrapper; signatures from the rows."""

    planned: dict[str, Any] | None
    __init__ = constructor_from_row(upstream.VARIABLE_INIT, _init)

    def _plan(self, call: dict[str, Any]) -> None:
        block_mask_map, num_kv_heads = call["block_mask_map"], call["num_kv_heads"]
        block_row_sz, block_col_sz = call["block_row_sz"], call["block_col_sz"]
        assert not call["causal"] and block_mask_map.dtype == torch.bool
        assert block_row_sz.dtype == torch.int32 and block_col_sz.dtype == torch.int32
        heads, mb, nb = block_mask_map.shape
        assert heads == num_kv_heads and call["num_qo_heads"] % num_kv_heads == 0
        assert block_row_sz.shape == (heads, mb) and block_col_sz.shape == (heads, nb)
        assert bool((block_row_sz > 0).all()) and bool((block_col_sz > 0).all())
        # every head's blocks cover the whole sequence (q/k are reshaped head by head)
        assert len(set(block_row_sz.sum(1).tolist())) == 1
        assert len(set(block_col_sz.sum(1).tolist())) == 1
        assert bool(block_mask_map.any()), "the library's index expansion fails on no blocks"
        self.planned = {
            "wrapper": "variable",
            "block_mask_map": block_mask_map.clone(),
            "block_row_sz": block_row_sz.clone(),
            "block_col_sz": block_col_sz.clone(),
            "heads": (call["num_qo_heads"], num_kv_heads, call["head_dim"]),
            "sm_scale": call["sm_scale"],
            "dtypes": (_dtype(call["q_data_type"]), _dtype(call["kv_data_type"])),
        }
        CALLS.append(self.planned)

    def _run(self, call: dict[str, Any]) -> Any:
        q, k, v, p = call["q"], call["k"], call["v"], self.planned
        assert p is not None, "plan first"
        _unused(call, "out", "lse")
        hq, hkv, d = p["heads"]
        sq, sk = int(p["block_row_sz"][0].sum()), int(p["block_col_sz"][0].sum())
        assert q.shape == (hq, sq, d) and k.shape == v.shape == (hkv, sk, d)
        assert q.dtype == p["dtypes"][0]
        allowed = variable_allowed(p["block_mask_map"], p["block_row_sz"], p["block_col_sz"])
        scale = p["sm_scale"] if p["sm_scale"] is not None else 1.0 / math.sqrt(d)
        o, lse2 = attend(q, k, v, allowed, scale)  # (Hq, S, D), (Hq, S)
        CALLS.append({"wrapper": "variable", "run": True, "lse": lse2})
        return (o, lse2) if call["return_lse"] else o

    plan = from_row(upstream.VARIABLE_PLAN, lambda call: call["self"]._plan(call))
    run = from_row(upstream.VARIABLE_RUN, lambda call: call["self"]._run(call))


def module(**overrides: Any) -> types.ModuleType:
    """A stand-in ``flashinfer`` module; ``overrides`` replace attributes."""
    mod = types.ModuleType("flashinfer")
    mod.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    attrs = {
        "BlockSparseAttentionWrapper": BlockSparseAttentionWrapper,
        "VariableBlockSparseAttentionWrapper": VariableBlockSparseAttentionWrapper,
    }
    for name, value in (attrs | overrides).items():
        setattr(mod, name, value)
    return mod


class OldBlockSparseAttentionWrapper(BlockSparseAttentionWrapper):
    """A wrapper whose ``run`` predates ``return_lse`` (the probe must refuse it)."""

    def run(self, q, k, v, scale_q=None, scale_k=None, scale_v=None):  # type: ignore[override]
        raise AssertionError("the probe must refuse this version before any call")
