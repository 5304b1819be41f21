"""Backward from merged softmax statistics through the libraries' own kernels: FA2, FA3, FFA.

Ring-style CP computes each step's gradients under the merged (out, lse) of the whole row; the
libraries' private backwards take exactly those (as ring-flash-attn and MagiAttention's
``dist_attn.py`` call them). Rows that attend no key go in with LSE +inf (every probability
exp(s - inf) = 0 whatever the block holds); FA2's private backward does not pad head dims to 8,
so they are padded here; FA3's two generations are told apart by parameters (`fa3_generation`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lcab.kernels.base import Grads
from lcab.kernels.callables import (  # callable_kind: re-exported, adapters ask here
    callable_kind,
    missing_default_overload,
    parameters_of,
)
from lcab.kernels.upstream import flash_attn as fa_table
from lcab.kernels.upstream import magi_ffa as ffa_table
from lcab.kernels.upstream.facts import LseLayout, UpstreamFunction
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:
    torch = lazy_module("torch", globals())
    F = lazy_module("torch.nn.functional", globals(), "F")


def library_lse(lse: torch.Tensor, layout: LseLayout, dtype: torch.dtype) -> torch.Tensor:
    """An LSE in lcab's (Hq, Sq) as a library's backward reads it; -inf rows become +inf.

    The kernels read it raw (FA2's ``mha_bwd``, ``flash_api.cpp`` L923, L1151), so it goes in as
    the dtype the library's own forward handed out (`lse_dtype_for`).
    """
    lse = lse.to(dtype).masked_fill(torch.isneginf(lse), float("inf"))
    if layout == "bhs":
        return lse.unsqueeze(0).contiguous()
    if layout == "th":
        return lse.t().contiguous()
    return lse.contiguous()


def lse_dtype_for(q: torch.Tensor, returned: torch.dtype | None) -> torch.dtype:
    """The LSE dtype a backward takes: what the library's forward returned (``run`` records it).

    Before any forward, float32: the kernels allocate their LSE as ``float`` (FA2
    ``flash_api.cpp`` L441, L652; FFA's and FA3's alike).
    """
    return returned if returned is not None else torch.float32


def _pad(x: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = (-x.shape[-1]) % multiple
    return F.pad(x, (0, extra)) if extra else x.contiguous()


GRADIENT_CALL = ("dout", "q", "k", "v", "out", "dq", "dk", "dv")


def _tensor_kwargs(batched: bool, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """dout, q, k, v, out and fresh dq, dk, dv by name; (1, S, H, D) views when ``batched``."""
    dout, q, k, v, out = tensors
    named = [dout, q, k, v, out, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]
    return dict(zip(GRADIENT_CALL, [t.unsqueeze(0) if batched else t for t in named], strict=True))


def _gradients(kwargs: dict[str, torch.Tensor], batched: bool) -> Grads:
    dq, dk, dv = (kwargs[name][0] if batched else kwargs[name] for name in ("dq", "dk", "dv"))
    return dq, dk, dv


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
    *,
    returned: torch.dtype | None = None,
) -> Grads:
    """One FA2 ``_flash_attn(_varlen)_backward`` call on packed (S, H, D) tensors.

    ``functions`` maps the table rows' names to the installed callables; ``call`` holds the
    lowered forward's keywords, so the backward applies the very mask the forward did.
    """
    head_dim = q.shape[-1]
    lse_dtype = lse_dtype_for(q, returned)
    kwargs: dict[str, Any] = _tensor_kwargs(not varlen, *(_pad(t, 8) for t in (dout, q, k, v, out)))
    left, right = call["window_size"]
    kwargs |= {"dropout_p": 0.0, "softmax_scale": call["softmax_scale"], "causal": call["causal"]}
    kwargs |= {"window_size_left": left, "window_size_right": right, "softcap": 0.0}
    kwargs |= {"alibi_slopes": None, "deterministic": False, "rng_state": None}
    if varlen:
        kwargs |= {name: call[name] for name in fa_table.VARLEN_ARGS}
    kwargs["softmax_lse"] = library_lse(lse, "ht" if varlen else "bhs", lse_dtype)
    row = fa_table.FA2_VARLEN_BACKWARD if varlen else fa_table.FA2_BACKWARD
    functions[row.name](*positional(row, kwargs))
    dq, dk, dv = _gradients(kwargs, not varlen)
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
    return tuple(p.name for p in parameters_of(fn) or ())


def keyword_only(fn: Any) -> tuple[str, ...]:
    """The parameters of an installed callable that cannot be passed by position."""
    return tuple(p.name for p in parameters_of(fn) or () if p.kind is p.KEYWORD_ONLY)


def mismatch(fn: Any, row: UpstreamFunction) -> str | None:
    """Why ``fn`` is not callable as ``row`` says (None: it is), naming the real cause."""
    kind = callable_kind(fn)
    if kind in ("missing", "not callable"):
        return f"{row.qualname} is {'missing' if fn is None else type(fn).__name__}"
    unreadable = missing_default_overload(fn)
    if unreadable:
        return f"{row.qualname} ({kind}) {unreadable}"
    found = parameters(fn)
    if found != row.params:
        return (
            f"{row.qualname} ({kind}) has parameters ({', '.join(found) or 'unreadable'}), "
            f"not ({', '.join(row.params)}) as {row.source.split(':')[0]} defines"
        )
    by_keyword = keyword_only(fn)
    if by_keyword != row.keyword_only:
        return (
            f"{row.qualname} ({kind}) takes ({', '.join(by_keyword) or 'none'}) by keyword "
            f"only, not ({', '.join(row.keyword_only) or 'none'}) as "
            f"{row.source.split(':')[0]} defines: lcab's call would not bind"
        )
    return None


def takes(fn: Any, row: UpstreamFunction) -> bool:
    """Whether ``fn`` — a function or a torch op — takes exactly ``row``'s parameters in order."""
    return mismatch(fn, row) is None


def positional(row: UpstreamFunction, kwargs: dict[str, Any]) -> list[Any]:
    """``kwargs`` as the row's positional arguments, as the libraries' own Python calls them.

    A row with keyword-only parameters cannot be called so: TypeError.
    """
    if row.keyword_only:
        raise TypeError(
            f"{row.qualname} takes {', '.join(row.keyword_only)} by keyword only: "
            "it cannot be called positionally"
        )
    ordered = _in_order(row, kwargs)
    return [ordered[p] if p in ordered else row.defaults[p] for p in row.params]


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
    *,
    returned: torch.dtype | None = None,
) -> Grads:
    """One FA3 ``_flash_attn_backward`` call of generation ``row`` on packed tensors."""
    kwargs: dict[str, Any] = _tensor_kwargs(not varlen, dout, q, k, v, out)
    kwargs["softmax_lse"] = library_lse(lse, "ht" if varlen else "bhs", lse_dtype_for(q, returned))
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
    result = fn(*positional(row, kwargs))
    if row is fa_table.FA3_BACKWARD_AUG_2025 and isinstance(result, tuple) and len(result) >= 3:
        kwargs |= dict(zip(("dq", "dk", "dv"), result[:3], strict=True))  # (dq, dk, dv, d)
    return _gradients(kwargs, not varlen)


def ffa_backward(
    fn: Callable[..., Any],
    call: Mapping[str, Any],
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    returned: torch.dtype | None = None,
) -> Grads:
    """One ``_flex_flash_attn_backward`` call, as MagiAttention's dist_attn makes per stage.

    As ``dist_attn.py`` does (v1.1.1 L1421-1451), FFA reduces into float32 accumulators and the
    step's gradients stay float32 until the ring's own accumulators: no step is rounded to bf16.
    """
    row = ffa_table.FFA_BACKWARD
    accumulate = torch.promote_types(q.dtype, torch.float32)
    kwargs: dict[str, Any] = {"dout": dout, "q": q, "k": k, "v": v, "out": out}
    lse = library_lse(lse, "th", lse_dtype_for(q, returned))
    kwargs |= {"sink": None, "sink_layout": "sh", "lse": lse}
    kwargs |= {name: torch.zeros(t.shape, dtype=accumulate, device=t.device) for name, t in (
        ("dq", q), ("dk", k), ("dv", v))}  # fmt: skip
    kwargs |= {"dsink": None, "softmax_scale": call["softmax_scale"], "softcap": 0.0}
    kwargs |= {name: call[name] for name in ("q_ranges", "k_ranges", "attn_type_map")}
    kwargs |= {"dq_type": accumulate, "dk_type": accumulate, "dv_type": accumulate}
    kwargs |= {"disable_bwd_dkv_atomic_reduction": False, "deterministic": False}
    kwargs["sm_margin"] = call.get("sm_margin", 0)
    dq, dk, dv, _ = fn(**_in_order(row, kwargs))  # keywords, as dist_attn.py calls it
    return dq, dk, dv
