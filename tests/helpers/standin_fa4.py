"""Stand-in for flash-attn-4's ``flash_attn.cute`` in plain torch (CPU contract tests only).

Its two functions take their signatures from the rows of `lcab.kernels.upstream.fa4` (read in
the 4.0.0b36 wheel's ``flash_attn/cute/interface.py``, held to the installed package by
``tests/unit/test_upstream_packages.py``): a call the real functions reject fails here too.
Their semantics are the source's, not lcab's lowering:

* emulator of the mask: sequence b owns query rows ``cu_q[b]:cu_q[b+1]`` (sq) and key columns
  ``cu_k[b]:cu_k[b+1]`` (sk); local query i sees local key j iff
  ``i + sk - sq - left <= j <= i + sk - sq + right`` (bottom-right aligned diagonal). ``None``
  is an unbounded side; an int is taken literally, even a negative one, and only a pair of two
  negative ints means "no window" (``_resolve_causal_local_window``, L438-459);
  ``causal=True`` makes right = 0;
* softmax attention under that mask in any float dtype, GQA by query groups (Hq % Hkv == 0),
  autograd through ``out`` **and** ``lse`` when ``return_lse=True`` (FA4's LSE is
  differentiable); with ``return_lse=False`` the LSE is returned detached when a grad is needed
  (FA4 then ignores ``dlse``) and as None otherwise;
* returns ``(out, lse)`` always; LSE natural log, (B, H, Sq) dense and (H, total_q) varlen,
  float32 for 16/32-bit inputs, float64 for float64 inputs (exact comparisons); fully masked rows
  give out 0 and LSE -inf.

`install` puts a package ``flash_attn`` (with no FA2 functions) and its submodule
``flash_attn.cute`` into ``sys.modules`` through a monkeypatch, so nothing outlives the test (the
FA2 stand-in uses the name ``flash_attn`` too). Every call is appended to ``CALLS``.
"""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import pytest
import torch

from lcab.kernels.upstream import fa4 as upstream
from tests.helpers.standin_flash_attn import module
from tests.helpers.standin_rows import from_row

CALLS: list[dict[str, Any]] = []
Window = tuple[int | None, int | None]


# ----------------------------------------------------------------------------- emulator
def window_allowed(sq: int, sk: int, causal: bool, window_size: Window) -> torch.Tensor:
    """(sq, sk) bool: what one sequence attends under FA4's documented rule."""
    left, right = window_size
    if left is not None and right is not None and left < 0 and right < 0:
        left = right = None  # FA4: two negative sides are no window at all
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = i + sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left is not None:
        ok &= j >= diag - left
    if right is not None:
        ok &= j <= diag + right
    return ok


def varlen_allowed(
    cu_q: torch.Tensor, cu_k: torch.Tensor, causal: bool, window_size: Window
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (Sq, Hq, D), k/v (Sk, Hkv, D) → out (Sq, Hq, D), lse (Hq, Sq) with -inf on empty rows."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
    empty = ~allowed.any(-1)
    keep = allowed | empty[:, None]  # empty rows: a harmless softmax, zeroed below
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(empty[None, :, None], 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    lse = lse.masked_fill(empty[None], float("-inf"))
    return out, lse.to(torch.promote_types(q.dtype, torch.float32))


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: int, window: Any) -> None:
    assert q.dim() == k.dim() == v.dim() == dims, (q.shape, k.shape)
    assert k.shape == v.shape and q.shape[-1] == k.shape[-1]
    assert q.shape[-2] % k.shape[-2] == 0, "num_head must be divisible by num_head_kv"
    assert isinstance(window, tuple) and len(window) == 2
    assert all(side is None or isinstance(side, int) for side in window), window


def _finish(out, lse, return_lse, record) -> tuple[torch.Tensor, torch.Tensor | None]:
    CALLS.append(record | {"lse": lse.detach(), "return_lse": return_lse})
    if return_lse:
        return out, lse
    needs_grad = torch.is_grad_enabled() and out.requires_grad
    return out, (lse.detach() if needs_grad else None)


def _unused(call: dict[str, Any], *names: str, **values: Any) -> None:
    """The arguments lcab never passes keep their defaults (nothing else is emulated)."""
    for name in names:
        assert call[name] is None, name
    for name, value in values.items():
        assert call[name] == value, name


def _dense(call: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, S, H, D) inputs → (out, lse (B, H, Sq))."""
    q, k, v = call["q"], call["k"], call["v"]
    causal, window_size, softmax_scale = call["causal"], call["window_size"], call["softmax_scale"]
    _unused(call, "qv", "gather_kv_indices", "mask_mod", "score_mod", "block_sparse_tensors")
    _unused(call, "learnable_sink", softcap=0.0)
    _check(q, k, v, 4, window_size)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    allowed = window_allowed(q.shape[1], k.shape[1], causal, window_size)
    outs, lses = zip(
        *(_attend(q[b], k[b], v[b], allowed, scale) for b in range(q.shape[0])), strict=True
    )
    record = {
        "fn": "dense",
        "kwargs": {"causal": causal, "window_size": window_size, "scale": scale},
        "shapes": (tuple(q.shape), tuple(k.shape)),
    }
    return _finish(torch.stack(outs), torch.stack(lses), call["return_lse"], record)


def _varlen(call: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(total, H, D) inputs with int32 cu_seqlens → (out, lse (H, total_q))."""
    q, k, v = call["q"], call["k"], call["v"]
    causal, window_size, softmax_scale = call["causal"], call["window_size"], call["softmax_scale"]
    cu_seqlens_q, cu_seqlens_k = call["cu_seqlens_q"], call["cu_seqlens_k"]
    max_seqlen_q, max_seqlen_k = call["max_seqlen_q"], call["max_seqlen_k"]
    _unused(call, "qv", "mask_mod", "seqused_q", "seqused_k", "page_table", "learnable_sink")
    _unused(call, "gather_kv_indices", "score_mod", "block_sparse_tensors", softcap=0.0)
    _check(q, k, v, 3, window_size)
    for cu, total, longest in (
        (cu_seqlens_q, q.shape[0], max_seqlen_q),
        (cu_seqlens_k, k.shape[0], max_seqlen_k),
    ):
        assert isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1
        assert cu.device == q.device and cu.stride(0) == 1
        assert int(cu[0]) == 0 and int(cu[-1]) == total and bool((cu.diff() >= 0).all())
        assert longest is None or (isinstance(longest, int) and longest >= int(cu.diff().max()))
    assert cu_seqlens_q.shape == cu_seqlens_k.shape
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    allowed = varlen_allowed(cu_seqlens_q, cu_seqlens_k, causal, window_size)
    out, lse = _attend(q, k, v, allowed, scale)
    record = {
        "fn": "varlen",
        "kwargs": {
            "cu_seqlens_q": cu_seqlens_q.clone(),
            "cu_seqlens_k": cu_seqlens_k.clone(),
            "max_seqlen_q": max_seqlen_q,
            "max_seqlen_k": max_seqlen_k,
            "causal": causal,
            "window_size": window_size,
            "scale": scale,
        },
        "shapes": (tuple(q.shape), tuple(k.shape)),
    }
    return _finish(out, lse, call["return_lse"], record)


flash_attn_func = from_row(upstream.FLASH_ATTN_FUNC, _dense)
flash_attn_varlen_func = from_row(upstream.FLASH_ATTN_VARLEN_FUNC, _varlen)


def flash_attn_func_before_return_lse(
    q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
    softcap=0.0, num_splits=1, pack_gqa=None, mask_mod=None,
):  # fmt: skip
    """The dense signature of a flash-attn-4 from before February 2026 (no return_lse)."""
    raise AssertionError("the probe must refuse this version before any call")


# ----------------------------------------------------------------------------- modules
def fa4_modules(**overrides: Any) -> tuple[types.ModuleType, types.ModuleType]:
    """Stand-in package ``flash_attn`` and its submodule ``flash_attn.cute``."""
    fns = {
        "flash_attn_func": flash_attn_func,
        "flash_attn_varlen_func": flash_attn_varlen_func,
    }
    cute = module("flash_attn.cute", **(fns | overrides))
    cute.__version__ = "0.0.0"  # as the real one: it reads a distribution named "fa4"
    parent = module("flash_attn", cute=cute)
    parent.__path__ = []  # a package, so "flash_attn.cute" is a submodule
    parent.__spec__.submodule_search_locations = []
    return parent, cute


def install(mp: pytest.MonkeyPatch, **overrides: Any) -> types.ModuleType:
    """Put the stand-in into ``sys.modules`` for one test (undone by the monkeypatch)."""
    parent, cute = fa4_modules(**overrides)
    mp.setitem(sys.modules, "flash_attn", parent)
    mp.setitem(sys.modules, "flash_attn.cute", cute)
    return cute
