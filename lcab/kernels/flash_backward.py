"""Backward from merged softmax statistics through the libraries' own kernels: FA2, FA3, FFA.

Ring-style context parallelism (Ring P2P, USP, LoongTrain) computes each step's gradients under
the statistics of the *whole* row — the merged output and LSE of every block — not the block's
own. FlashAttention's backward takes exactly those as inputs (it recomputes P = exp(S - lse)),
so the peers call the libraries' private backward once per step with the merged (out, lse):
ring-flash-attn 0.1.7 ``_flash_attn_backward`` / ``_flash_attn_varlen_backward`` with
preallocated dq/dk/dv, accumulated across steps in float32; MagiAttention's own
``dist_attn.py`` ``_flex_flash_attn_backward`` per stage. lcab does the same: the functions here
make one such call, and the ring (`lcab.cp.ring_attention`) accumulates in float32.

What each call needs is in the upstream tables (`lcab.kernels.upstream`), which these calls
follow:

* the LSE goes in the library's layout — (B, H, Sq) dense, (H, total_q) varlen, (total_q, Hq)
  for FFA — and rows that attend no key anywhere go in as +inf: every probability of such a row
  is then exp(s - inf) = 0. (The kernels read -inf as 0, which is harmless only while the row's
  keys are all masked; +inf is right whatever the block holds, as FA2 itself uses for rows out
  of range.)
* FA2's private backward checks ``head_size % 8 == 0`` and does not pad (its public call pads):
  head dims are padded here and the gradients cut back; FA3 refuses such head dims earlier.
* FA3 has two generations of ``_flash_attn_backward``; the installed one is recognised by its
  parameters (`fa3_generation`), and anything else is a precise ``skipped`` reason, never a guess.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from lcab.kernels.upstream import flash_attn as fa_table
from lcab.kernels.upstream import magi_ffa as ffa_table
from lcab.kernels.upstream.facts import LseLayout, UpstreamFunction

Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def library_lse(lse: torch.Tensor, layout: LseLayout) -> torch.Tensor:
    """An LSE in lcab's (Hq, Sq) as a library's backward reads it; -inf rows become +inf."""
    lse = lse.masked_fill(torch.isneginf(lse), float("inf"))
    if layout == "bhs":
        return lse.unsqueeze(0).contiguous()
    if layout == "th":
        return lse.t().contiguous()
    return lse.contiguous()


def _pad(x: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = (-x.shape[-1]) % multiple
    return F.pad(x, (0, extra)) if extra else x.contiguous()


def fa2_backward(
    functions: Mapping[str, Callable[..., Any]],
    call: Mapping[str, Any],
    varlen: bool,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> Grads:
    """One FA2 ``_flash_attn(_varlen)_backward`` call on packed (S, H, D) tensors.

    ``functions`` maps the table rows' names to the installed callables; ``call`` holds the
    lowered forward's keywords (scale, causal, window_size, and cu_seqlens / max_seqlen for
    varlen), so the backward applies the very mask the forward did.
    """
    head_dim = q.shape[-1]
    dout, q, k, v, out = (_pad(t, 8) for t in (dout, q, k, v, out))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    left, right = call["window_size"]
    common = {
        "dropout_p": 0.0,
        "softmax_scale": call["softmax_scale"],
        "causal": call["causal"],
        "window_size_left": left,
        "window_size_right": right,
        "softcap": 0.0,
        "alibi_slopes": None,
        "deterministic": False,
        "rng_state": None,
    }
    if varlen:
        row = fa_table.FA2_VARLEN_BACKWARD
        tensors = {"dout": dout, "q": q, "k": k, "v": v, "out": out, "dq": dq, "dk": dk, "dv": dv}
        varlen_args = {name: call[name] for name in fa_table.VARLEN_ARGS}
        kwargs = tensors | varlen_args | common
        kwargs["softmax_lse"] = library_lse(lse, "ht")
    else:
        row = fa_table.FA2_BACKWARD
        batched = [t.unsqueeze(0) for t in (dout, q, k, v, out, dq, dk, dv)]
        kwargs = dict(zip(("dout", "q", "k", "v", "out", "dq", "dk", "dv"), batched, strict=True))
        kwargs |= common
        kwargs["softmax_lse"] = library_lse(lse, "bhs")
        dq, dk, dv = batched[5][0], batched[6][0], batched[7][0]
    functions[row.name](**_in_order(row, kwargs))
    return dq[..., :head_dim], dk[..., :head_dim], dv[..., :head_dim]


def _in_order(row: UpstreamFunction, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` checked against the row: every parameter named, none unknown."""
    missing = [p for p in row.params if p not in kwargs and p not in row.defaults]
    unknown = [name for name in kwargs if name not in row.params]
    if missing or unknown:  # a bug in lcab, not a user error: the table is the contract
        raise TypeError(f"{row.qualname}: missing {missing}, unknown {unknown}")
    return {p: kwargs[p] for p in row.params if p in kwargs}


def parameters(fn: Any) -> tuple[str, ...]:
    """Parameter names of an installed callable (empty when it has no readable signature)."""
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def takes(fn: Any, row: UpstreamFunction) -> bool:
    """Whether ``fn`` is callable with exactly the parameters of ``row``, in its order."""
    return callable(fn) and parameters(fn) == row.params


def fa3_generation(fn: Callable[..., Any]) -> UpstreamFunction | None:
    """The table row of the installed FA3 ``_flash_attn_backward`` (None: neither generation)."""
    for row in (fa_table.FA3_BACKWARD, fa_table.FA3_BACKWARD_AUG_2025):
        if takes(fn, row):
            return row
    return None


def fa3_backward(
    fn: Callable[..., Any],
    row: UpstreamFunction,
    call: Mapping[str, Any],
    varlen: bool,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> Grads:
    """One FA3 ``_flash_attn_backward`` call of generation ``row`` on packed tensors."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = [dout, q, k, v, out, dq, dk, dv]
    if not varlen:
        tensors = [t.unsqueeze(0) for t in tensors]
    kwargs: dict[str, Any] = dict(
        zip(("dout", "q", "k", "v", "out", "dq", "dk", "dv"), tensors, strict=True)
    )
    kwargs["softmax_lse"] = library_lse(lse, "ht" if varlen else "bhs")
    for name in fa_table.VARLEN_ARGS:
        kwargs[name] = call[name] if varlen else None
    kwargs |= {"sequed_q": None, "sequed_k": None, "softmax_scale": call["softmax_scale"]}
    kwargs |= {"softcap": 0.0, "deterministic": False, "sm_margin": call.get("sm_margin", 0)}
    left, right = call["window_size"]
    if row is fa_table.FA3_BACKWARD:
        kwargs |= {"is_causal": call["causal"], "window_size_left": left}
        kwargs["window_size_right"] = right
    else:
        kwargs |= {"causal": call["causal"], "window_size": (left, right)}
    fn(**_in_order(row, kwargs))
    if not varlen:
        dq, dk, dv = tensors[5][0], tensors[6][0], tensors[7][0]
    return dq, dk, dv


def ffa_backward(
    fn: Callable[..., Any],
    call: Mapping[str, Any],
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> Grads:
    """One ``_flex_flash_attn_backward`` call, as MagiAttention's dist_attn makes per stage.

    dq/dk/dv are left to FFA to allocate (zeros in float32, its ``*_type``); they come back in
    the inputs' dtype like every other kernel's step gradients.
    """
    row = ffa_table.FFA_BACKWARD
    kwargs: dict[str, Any] = {"dout": dout, "q": q, "k": k, "v": v, "out": out}
    kwargs |= {"sink": None, "sink_layout": "sh", "lse": library_lse(lse, "th")}
    kwargs |= {"dq": None, "dk": None, "dv": None, "dsink": None}
    kwargs |= {name: call[name] for name in ("q_ranges", "k_ranges", "attn_type_map")}
    kwargs |= {"softmax_scale": call["softmax_scale"], "softcap": 0.0}
    accumulate = torch.promote_types(q.dtype, torch.float32)
    kwargs |= {"dq_type": accumulate, "dk_type": accumulate, "dv_type": accumulate}
    kwargs |= {"disable_bwd_dkv_atomic_reduction": False, "deterministic": False, "sm_margin": 0}
    dq, dk, dv, _ = fn(**_in_order(row, kwargs))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
