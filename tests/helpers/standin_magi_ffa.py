"""Stand-in for ``magi_attention.functional`` (MagiAttention v1.1 FFA) in plain torch.

Its signatures are the rows of `lcab.kernels.upstream.magi_ffa` (v1.1.1, built by `from_row`);
its semantics are FFA's (gpu_kernels.md §3.7, ``flex_flash_attn.py``), not lcab's lowering, so
lcab's adapter can be contract-tested on CPU (never GPU-verified):

* emulator of the mask: slice s covers query rows ``q_ranges[s]`` (m rows) and key columns
  ``k_ranges[s]`` (n columns); local row i sees local column j under ``attn_type_map[s]``:
  0 full; 1 causal, bottom-right aligned, ``j <= i + n - m``; 2 inverse causal, top-left
  aligned, ``j >= i``; 3 bidirectional causal, both;
* FFA reduces the partial results of every slice of a query row (atomically), so a (row, key)
  pair covered by two slices counts twice; the stand-in reproduces that with the coverage
  multiplicity (``log(count)`` added to the scores), so an adapter that passed overlapping
  slices would fail the contract test rather than pass by luck;
* softmax attention, any float dtype (float64 for exact comparisons), GQA by query groups,
  autograd through ``out``; the LSE requires grad as on a GPU, its gradient dropped as
  ``FlexFlashAttnFunc.backward`` drops it;
* ``_flex_flash_attn_backward`` computes dq/dk/dv from the given out and LSE (total_q, Hq)
  with FlashAttention's backward algorithm over the same covered pairs, allocating them in
  ``dq/dk/dv_type`` as v1.1.1 does when given None;
* returns ``(out, meta)`` with ``meta.lse`` natural log, (total_q, Hq), float32 for 16/32-bit
  inputs (float64 for float64 inputs, so the contract test can be exact). The value on rows
  attending no key is undocumented (-inf here by default; ``EMPTY_LSE`` changes it).

Every call is appended to ``CALLS`` (its keyword arguments and the raw LSE).
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch

from lcab.kernels.upstream import magi_ffa as table
from tests.helpers.standin_flash_attn import module
from tests.helpers.standin_rows import flash_backward_math, from_row, looks_differentiable

CALLS: list[dict[str, Any]] = []
EMPTY_LSE = {"value": float("-inf")}
"""What the stand-in writes as LSE of a row attending nothing (undocumented in FFA)."""


# ----------------------------------------------------------------------------- emulator
def kind_allowed(m: int, n: int, kind: int) -> torch.Tensor:
    """(m, n) bool: one slice of ``kind`` under FFA's documented alignment."""
    i = torch.arange(m)[:, None]
    j = torch.arange(n)[None, :]
    causal = j <= i + n - m
    inverse = j >= i
    table = {0: torch.ones(m, n, dtype=torch.bool), 1: causal, 2: inverse, 3: causal & inverse}
    return table[kind]


def coverage(
    q_ranges: torch.Tensor, k_ranges: torch.Tensor, attn_type_map: torch.Tensor, sq: int, sk: int
) -> torch.Tensor:
    """(sq, sk) int: how many slices cover each (row, key) pair."""
    count = torch.zeros(sq, sk, dtype=torch.int64)
    for (q0, q1), (k0, k1), kind in zip(
        q_ranges.tolist(), k_ranges.tolist(), attn_type_map.tolist(), strict=True
    ):
        count[q0:q1, k0:k1] += kind_allowed(q1 - q0, k1 - k0, kind)
    return count


def allowed_of_call(call: dict[str, Any], seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """The dense (Sq, Sk) mask a recorded call applies; a pair covered twice is an error."""
    kw = call["kwargs"]
    count = coverage(kw["q_ranges"], kw["k_ranges"], kw["attn_type_map"], seqlen_q, seqlen_k)
    assert count.numel() == 0 or int(count.max()) <= 1, "a (row, key) pair is covered by two slices"
    return count > 0


# ----------------------------------------------------------------------------- attention
def _check_ranges(ranges: torch.Tensor, total: int, q: torch.Tensor) -> None:
    assert isinstance(ranges, torch.Tensor) and ranges.dtype == torch.int32
    assert ranges.dim() == 2 and ranges.shape[1] == 2 and ranges.is_contiguous()
    assert ranges.device == q.device
    assert bool((ranges[:, 0] >= 0).all()) and bool((ranges[:, 1] <= total).all())
    assert bool((ranges[:, 0] < ranges[:, 1]).all()), "empty range"


def _ffa_call(a: dict[str, Any]) -> tuple[torch.Tensor, types.SimpleNamespace]:
    """v1.1.1's ``flex_flash_attn_func``: q (total_q, Hq, D), k/v (total_k, Hkv, D)."""
    q, k, v = a["q"], a["k"], a["v"]
    q_ranges, k_ranges, attn_type_map = a["q_ranges"], a["k_ranges"], a["attn_type_map"]
    softmax_scale = a["softmax_scale"]
    assert a["sink"] is None and a["softcap"] == 0.0 and not a["disable_fwd_atomic_reduction"]
    assert a["index_attn_indices"] is None and not a["index_attn"]
    assert q.dim() == k.dim() == v.dim() == 3 and k.shape == v.shape
    assert q.shape[-1] == k.shape[-1] and q.shape[1] % k.shape[1] == 0
    _check_ranges(q_ranges, q.shape[0], q)
    _check_ranges(k_ranges, k.shape[0], q)
    assert attn_type_map.dtype == torch.int32 and attn_type_map.shape == (q_ranges.shape[0],)
    assert attn_type_map.device == q.device and bool(
        ((attn_type_map >= 0) & (attn_type_map <= 3)).all()
    )
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    count = coverage(q_ranges, k_ranges, attn_type_map, q.shape[0], k.shape[0])
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
    empty = count.sum(-1) == 0
    weight = torch.where(empty[:, None], 1.0, count.to(q.dtype))  # empty rows: zeroed below
    scores = scores + torch.log(weight)
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(empty[None, :, None], 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    lse = lse.detach().masked_fill(empty[None], EMPTY_LSE["value"])
    lse = lse.t().contiguous().to(torch.promote_types(q.dtype, torch.float32))  # (total_q, Hq)
    lse = looks_differentiable(lse, q, k, v)
    CALLS.append(
        {
            "kwargs": {
                "q_ranges": q_ranges.clone(),
                "k_ranges": k_ranges.clone(),
                "attn_type_map": attn_type_map.clone(),
                "scale": scale,
                "sm_margin": a["sm_margin"],
            },
            "lse": lse,
        }
    )
    return out, types.SimpleNamespace(lse=lse, max_logits=None)


flex_flash_attn_func = from_row(table.FFA_FUNC, _ffa_call)


def _ffa_backward(a: dict[str, Any]) -> tuple[Any, ...]:
    """v1.1.1's ``_flex_flash_attn_backward`` (dq/dk/dv given as None: allocated here)."""
    q, k, v, out, dout, lse = a["q"], a["k"], a["v"], a["out"], a["dout"], a["lse"]
    assert a["sink"] is None and a["dsink"] is None and a["softcap"] == 0.0
    assert not a["disable_bwd_dkv_atomic_reduction"] and not a["auto_range_merge"]
    assert lse.shape == (q.shape[0], q.shape[1]) and lse.is_contiguous(), "LSE is (total_q, Hq)"
    for name in ("q_ranges", "k_ranges"):
        _check_ranges(a[name], (q if name == "q_ranges" else k).shape[0], q)
    count = coverage(a["q_ranges"], a["k_ranges"], a["attn_type_map"], q.shape[0], k.shape[0])
    grads = flash_backward_math(dout, q, k, v, out, lse.t(), count, a["softmax_scale"])
    result = []
    for name, grad, like in zip(("dq", "dk", "dv"), grads, (q, k, v), strict=True):
        kind = a[f"{name}_type"] or torch.float32
        given = a[name]
        target = torch.zeros_like(like, dtype=kind) if given is None else given
        result.append(target.add_(grad.to(target.dtype)))  # FFA accumulates into given buffers
    CALLS.append({"fn": "backward", "kwargs": dict(a)})
    return (*result, None)


flex_flash_attn_backward = from_row(table.FFA_BACKWARD, _ffa_backward)


def flex_flash_attn_func_before_v1_1(
    q, k, v, q_ranges, k_ranges, max_seqlen_q, max_seqlen_k, attn_type_map=None,
    softmax_scale=None, softcap=0.0, deterministic=False, sm_margin=0, return_dtype=None,
    disable_fwd_atomic_reduction=False, auto_range_merge=False,
):  # fmt: skip
    """An older FFA: max_seqlen_q/k required by position, returns (out, lse)."""
    raise AssertionError("the probe must refuse this API before any call")


def returning_lse_tensor(q, k, v, q_ranges=None, k_ranges=None, attn_type_map=None, **kw):
    """A build whose second item is the bare LSE tensor (not a meta object)."""
    out, meta = flex_flash_attn_func(q, k, v, q_ranges, k_ranges, attn_type_map, **kw)
    return out, meta.lse


def backward_before_v1_1(dout, q, k, v, out, lse, dq, dk, dv, q_ranges, k_ranges, **kw):
    """A private backward of another generation (no sink, different order)."""
    raise AssertionError("lcab must not call a backward whose parameters it does not know")


# ----------------------------------------------------------------------------- modules
def modules(**overrides: Any) -> dict[str, types.ModuleType]:
    """Stand-ins for ``magi_attention`` and ``magi_attention.functional``, by name."""
    backward = overrides.pop("_flex_flash_attn_backward", flex_flash_attn_backward)
    private = module(
        "magi_attention.functional.flex_flash_attn",
        flex_flash_attn_func=flex_flash_attn_func,
        _flex_flash_attn_backward=backward,
    )
    functional = module(
        "magi_attention.functional",
        flex_flash_attn=private,
        **({"flex_flash_attn_func": flex_flash_attn_func} | overrides),
    )
    parent = module("magi_attention", functional=functional)
    return {
        "magi_attention": parent,
        "magi_attention.functional": functional,
        "magi_attention.functional.flex_flash_attn": private,
    }
