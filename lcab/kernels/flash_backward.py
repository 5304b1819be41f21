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

    The kernels read it raw and unchecked (FA2's ``mha_bwd`` passes ``softmax_lse.data_ptr()``,
    ``flash_api.cpp`` L923, L1151): it goes in as ``dtype``, the dtype the library's own forward
    handed out (`lse_dtype_for`), exactly as the library's autograd passes back its saved LSE.
    """
    lse = lse.to(dtype).masked_fill(torch.isneginf(lse), float("inf"))
    if layout == "bhs":
        return lse.unsqueeze(0).contiguous()
    if layout == "th":
        return lse.t().contiguous()
    return lse.contiguous()


def lse_dtype_for(q: torch.Tensor, returned: torch.dtype | None) -> torch.dtype:
    """The LSE dtype a backward takes: what the library's forward returned for these inputs.

    ``returned`` is recorded by the prepared call's `run`. Without one (a backward before any
    forward of this prepared call), float32 whatever the inputs: the kernels allocate their LSE
    as ``float`` (FA2 ``flash_api.cpp`` L441, L652; FFA's and FA3's alike), and only a CPU
    emulation takes float64 inputs at all — one that also returns a float64 LSE is heard from
    after its forward has run.
    """
    return returned if returned is not None else torch.float32


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
    *,
    returned: torch.dtype | None = None,
) -> Grads:
    """One FA2 ``_flash_attn(_varlen)_backward`` call on packed (S, H, D) tensors.

    ``functions`` maps the table rows' names to the installed callables; ``call`` holds the
    lowered forward's keywords (scale, causal, window_size, and cu_seqlens / max_seqlen for
    varlen), so the backward applies the very mask the forward did; ``returned`` is the dtype
    of the LSE the forward returned (`lse_dtype_for`).
    """
    head_dim = q.shape[-1]
    lse_dtype = lse_dtype_for(q, returned)
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
        kwargs["softmax_lse"] = library_lse(lse, "ht", lse_dtype)
    else:
        row = fa_table.FA2_BACKWARD
        batched = [t.unsqueeze(0) for t in (dout, q, k, v, out, dq, dk, dv)]
        kwargs = dict(zip(("dout", "q", "k", "v", "out", "dq", "dk", "dv"), batched, strict=True))
        kwargs |= common
        kwargs["softmax_lse"] = library_lse(lse, "bhs", lse_dtype)
        dq, dk, dv = batched[5][0], batched[6][0], batched[7][0]
    functions[row.name](*positional(row, kwargs))
    return dq[..., :head_dim], dk[..., :head_dim], dv[..., :head_dim]


def _in_order(row: UpstreamFunction, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` checked against the row: every parameter named, none unknown."""
    missing = [p for p in row.params if p not in kwargs and p not in row.defaults]
    unknown = [name for name in kwargs if name not in row.params]
    if missing or unknown:  # a bug in lcab, not a user error: the table is the contract
        raise TypeError(f"{row.qualname}: missing {missing}, unknown {unknown}")
    return {p: kwargs[p] for p in row.params if p in kwargs}


def parameters(fn: Any) -> tuple[str, ...]:
    """Parameter names of an installed callable (empty when it has no readable signature).

    Read for each kind of callable by `lcab.kernels.callables.parameters_of`.
    """
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
    """Whether ``fn`` — a function or a torch op — takes exactly ``row``'s parameters in order.

    The keyword-only ones among them must be those the row marks. The kind of object is not
    part of the test: lcab calls FA2's and FA3's positionally in the row's order, which a plain
    function, a custom op and a schema op all accept (FFA's, a plain function, by keyword as
    MagiAttention's ``dist_attn.py`` does).
    """
    return mismatch(fn, row) is None


def positional(row: UpstreamFunction, kwargs: dict[str, Any]) -> list[Any]:
    """``kwargs`` as the row's positional arguments, a parameter not given at its default.

    That is how the libraries' own Python calls these functions (flash-attn's
    ``_wrapped_flash_attn_backward(dout, q, ...)``, FA3's ``_backward``), and a plain function,
    a custom op and a schema op all take it — unless a parameter is keyword-only, which no
    positional call can reach: such a row is refused here, before the call.

    Raises:
        TypeError: the row has keyword-only parameters (a bug in lcab's choice of call).

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
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = [dout, q, k, v, out, dq, dk, dv]
    if not varlen:
        tensors = [t.unsqueeze(0) for t in tensors]
    kwargs: dict[str, Any] = dict(
        zip(("dout", "q", "k", "v", "out", "dq", "dk", "dv"), tensors, strict=True)
    )
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
        tensors[5:8] = result[:3]  # that generation returns (dq, dk, dv, softmax_d): take them
    if not varlen:
        return tensors[5][0], tensors[6][0], tensors[7][0]
    return tensors[5], tensors[6], tensors[7]


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

    As ``dist_attn.py`` does (v1.1.1 L1421-1451: ``dq=dq_acc``, ``*_type=self.hp_dtype``), FFA
    reduces into float32 accumulators it is given (float64 for float64 inputs) and the step's
    gradients stay in that precision: the ring adds them into its own float32 accumulators
    (`lcab.cp.ring_attention`), so no step is rounded to bf16 on the way. ``sm_margin`` is the
    kernel's option (``kernel.sm_margin``), as for FA3.
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
