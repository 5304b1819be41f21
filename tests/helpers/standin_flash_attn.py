"""Stand-ins for ``flash_attn`` (2.8) and ``flash_attn_interface`` (FA3 hopper) in plain torch.

They implement the *documented* signatures and semantics (gpu_kernels.md §1.1, §1.2, §3.1,
§3.2), not lcab's lowering, so lcab's adapters can be contract-tested on CPU (never
GPU-verified):

* emulator of the mask: sequence b owns query rows ``cu_q[b]:cu_q[b+1]`` (sq) and key columns
  ``cu_k[b]:cu_k[b+1]`` (sk); local query i sees local key j iff
  ``i + sk - sq - left <= j <= i + sk - sq + right`` (bottom-right aligned diagonal), with
  -1 = unbounded side and ``causal=True`` meaning right = 0; no key of another sequence;
* softmax attention under that mask, any float dtype (float64 for exact comparisons), GQA by
  query groups (Hq % Hkv == 0), autograd through ``out``; the LSE is detached (the libraries'
  LSE is not differentiable);
* returns as documented: FA2 ``(out, lse, S_dmask)`` and FA3 ``(out, lse)`` with
  ``return_attn_probs=True``, else ``out``; LSE natural log in (B, H, Sq) for the dense call and
  (H, total_q) for varlen; fully masked rows: out 0 and LSE +inf (FA2) or -inf (FA3). The LSE
  is float32 for 16/32-bit inputs as in the libraries, float64 for float64 inputs (so the
  contract test can be exact).

Every call is appended to ``CALLS`` (which function, its keyword arguments, the raw LSE).
"""

from __future__ import annotations

import importlib.machinery
import math
import types
from typing import Any

import torch

CALLS: list[dict[str, Any]] = []


# ----------------------------------------------------------------------------- emulator
def window_allowed(sq: int, sk: int, causal: bool, window_size: tuple[int, int]) -> torch.Tensor:
    """(sq, sk) bool: what one sequence attends under FlashAttention's documented rule."""
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = i + sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def varlen_allowed(
    cu_q: torch.Tensor, cu_k: torch.Tensor, causal: bool, window_size: tuple[int, int]
) -> torch.Tensor:
    """(total_q, total_k) bool: block-diagonal sequences, each under `window_allowed`."""
    cq, ck = [int(x) for x in cu_q.tolist()], [int(x) for x in cu_k.tolist()]
    out = torch.zeros(cq[-1], ck[-1], dtype=torch.bool)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        out[q0:q1, k0:k1] = window_allowed(q1 - q0, k1 - k0, causal, window_size)
    return out


def allowed_of_call(call: dict[str, Any], seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """The dense (Sq, Sk) mask a recorded call applies (batch 1 for the dense call)."""
    kw = call["kwargs"]
    if call["fn"] == "varlen":
        return varlen_allowed(
            kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["causal"], kw["window_size"]
        )
    return window_allowed(seqlen_q, seqlen_k, kw["causal"], kw["window_size"])


# ----------------------------------------------------------------------------- attention
def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (Sq, Hq, D), k/v (Sk, Hkv, D) → out (Sq, Hq, D), lse (Hq, Sq), empty rows (Sq,)."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
    empty = ~allowed.any(-1)
    keep = allowed | empty[:, None]  # empty rows: a harmless softmax, zeroed below
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(empty[None, :, None], 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    return out, lse.detach().to(torch.promote_types(q.dtype, torch.float32)), empty


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: int) -> None:
    assert q.dim() == k.dim() == v.dim() == dims, (q.shape, k.shape)
    assert k.shape == v.shape and q.shape[-1] == k.shape[-1]
    assert q.shape[-2] % k.shape[-2] == 0, "Hq must be a multiple of Hkv"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1


def _dense(
    q, k, v, softmax_scale, causal, window_size, empty_lse, fn_name
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_qkv(q, k, v, 4)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    allowed = window_allowed(q.shape[1], k.shape[1], causal, tuple(window_size))
    outs, lses = [], []
    for b in range(q.shape[0]):
        out, lse, empty = _attend(q[b], k[b], v[b], allowed, scale)
        outs.append(out)
        lses.append(lse.masked_fill(empty[None], empty_lse))
    out, lse = torch.stack(outs), torch.stack(lses)  # (B, Sq, H, D), (B, H, Sq)
    CALLS.append(
        {
            "fn": "dense",
            "api": fn_name,
            "kwargs": {"causal": causal, "window_size": tuple(window_size), "scale": scale},
            "shapes": (tuple(q.shape), tuple(k.shape)),
            "lse": lse,
        }
    )
    return out, lse


def _varlen(
    q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, window_size, empty_lse, fn_name
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_qkv(q, k, v, 3)
    for cu, total, longest in ((cu_q, q.shape[0], max_q), (cu_k, k.shape[0], max_k)):
        assert isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1
        assert cu.device == q.device and cu.is_contiguous()
        assert int(cu[0]) == 0 and int(cu[-1]) == total and bool((cu.diff() >= 0).all())
        assert isinstance(longest, int) and longest >= int(cu.diff().max())
    assert len(cu_q) == len(cu_k)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    allowed = varlen_allowed(cu_q, cu_k, causal, tuple(window_size))
    out, lse, empty = _attend(q, k, v, allowed, scale)
    lse = lse.masked_fill(empty[None], empty_lse)  # (H, total_q)
    CALLS.append(
        {
            "fn": "varlen",
            "api": fn_name,
            "kwargs": {
                "cu_seqlens_q": cu_q.clone(),
                "cu_seqlens_k": cu_k.clone(),
                "max_seqlen_q": max_q,
                "max_seqlen_k": max_k,
                "causal": causal,
                "window_size": tuple(window_size),
                "scale": scale,
            },
            "shapes": (tuple(q.shape), tuple(k.shape)),
            "lse": lse,
        }
    )
    return out, lse


# ----------------------------------------------------------------------------- FA2 (2.8 API)
def fa2_flash_attn_func(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    assert dropout_p == 0.0 and softcap == 0.0 and alibi_slopes is None
    out, lse = _dense(q, k, v, softmax_scale, causal, window_size, float("inf"), "fa2")
    return (out, lse, torch.empty(0)) if return_attn_probs else out


def fa2_flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False, block_table=None,
):  # fmt: skip
    assert dropout_p == 0.0 and softcap == 0.0 and alibi_slopes is None and block_table is None
    out, lse = _varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size, float("inf"), "fa2",
    )  # fmt: skip
    return (out, lse, torch.empty(0)) if return_attn_probs else out


def fa2_varlen_without_window(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, return_attn_probs=False,
):  # fmt: skip
    """The varlen signature of a flash-attn older than 2.3 (no window_size)."""
    raise AssertionError("the probe must refuse this version before any call")


# ----------------------------------------------------------------------------- FA3 (hopper)
def fa3_flash_attn_func(
    q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False,
):  # fmt: skip
    assert qv is None and attention_chunk == 0 and softcap == 0.0
    out, lse = _dense(q, k, v, softmax_scale, causal, window_size, float("-inf"), "fa3")
    return (out, lse) if return_attn_probs else out


def fa3_flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
    seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False,
):  # fmt: skip
    assert seqused_q is None and seqused_k is None and qv is None and attention_chunk == 0
    out, lse = _varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size, float("-inf"), "fa3",
    )  # fmt: skip
    return (out, lse) if return_attn_probs else out


def fa3_flash_attn_func_before_july_2025(
    q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
    v_descale=None, window_size=(-1, -1), softcap=0.0, num_splits=1, pack_gqa=None,
    deterministic=False, sm_margin=0,
):  # fmt: skip
    """An FA3 build from before July 2025: always (out, lse), no return_attn_probs."""
    raise AssertionError("the probe must refuse this build before any call")


# ----------------------------------------------------------------------------- modules
def module(name: str, **functions: Any) -> types.ModuleType:
    """A module object that `importlib.util.find_spec` and `importlib.import_module` accept."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for attr, fn in functions.items():
        setattr(mod, attr, fn)
    return mod


def fa2_module(**overrides: Any) -> types.ModuleType:
    """Stand-in ``flash_attn`` (2.8 API); ``overrides`` replace functions."""
    fns = {
        "flash_attn_func": fa2_flash_attn_func,
        "flash_attn_varlen_func": fa2_flash_attn_varlen_func,
    }
    return module("flash_attn", **(fns | overrides))


def fa3_module(**overrides: Any) -> types.ModuleType:
    """Stand-in ``flash_attn_interface`` (FA3 hopper, July 2025+ API)."""
    fns = {
        "flash_attn_func": fa3_flash_attn_func,
        "flash_attn_varlen_func": fa3_flash_attn_varlen_func,
    }
    return module("flash_attn_interface", **(fns | overrides))


STANDINS = {"fa2": ("flash_attn", fa2_module), "fa3": ("flash_attn_interface", fa3_module)}
