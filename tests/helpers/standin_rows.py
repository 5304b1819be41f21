"""Stand-in functions built from the upstream tables, and FlashAttention's backward in torch.

`from_row` gives a stand-in exactly the signature its `UpstreamFunction` row states: a call the
real function would reject (a missing argument, an unknown keyword, one too many by position)
fails the same way, and ``inspect.signature`` — what the adapters probe — shows the row. So a
stand-in cannot drift from the table, and the table is held to the real libraries elsewhere
(``tests/unit/test_upstream_*.py``).

`flash_backward_math` is the backward FlashAttention's kernels compute from the saved (out, lse)
(FlashAttention-2 paper, Algorithm 2): P = exp(scale·QKᵀ - lse) on the allowed pairs,
dV = Pᵀ dO, dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP - D), dQ = scale·dS K,
dK = scale·dSᵀ Q — written from that algorithm, not from lcab's generic route (autograd
through the LSE), so the two can disagree. As the kernels do, an LSE of -inf is read as 0
(FA2 ``softmax.h`` L76; FA3 ``flash_bwd_preprocess_kernel.h`` L228).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from lcab.kernels.upstream.facts import UpstreamFunction


def from_row(row: UpstreamFunction, impl: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """A function with ``row``'s signature that calls ``impl`` with its bound arguments."""

    def standin(*args: Any, **kwargs: Any) -> Any:
        return impl(row.bind(*args, **kwargs))

    standin.__signature__ = row.signature()  # type: ignore[attr-defined]
    standin.__name__ = row.name.split(".")[-1]
    standin.__qualname__ = standin.__name__
    return standin


def constructor_from_row(
    row: UpstreamFunction, impl: Callable[[Any, dict[str, Any]], None]
) -> Callable[..., None]:
    """An ``__init__`` for a stand-in class whose row is the class itself.

    A class row lists the constructor's parameters without ``self`` (``inspect.signature`` of
    the class); this ``__init__`` binds them as the real constructor would and calls
    ``impl(self, arguments)``.
    """

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        impl(self, row.bind(*args, **kwargs))

    own = row.signature()
    first = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    init.__signature__ = own.replace(  # type: ignore[attr-defined]
        parameters=[first, *own.parameters.values()]
    )
    init.__name__ = init.__qualname__ = "__init__"
    return init


def flash_backward_math(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of packed q (Sq, Hq, D), k/v (Sk, Hkv, D) from out and lse (Hq, Sq).

    ``allowed`` (Sq, Sk) is the mask of the call (bool, or an int count of the slices covering
    a pair, which FFA's reduction adds up); GQA gradients of a KV head are the sum over its
    query group, as the kernels reduce them.
    """
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    wide = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf = q.to(wide), kk.to(wide), vv.to(wide)
    do, o = dout.to(wide), out.to(wide)
    stats = torch.where(torch.isneginf(lse), 0.0, lse).to(wide)  # (Hq, Sq)
    scores = torch.einsum("qhd,khd->hqk", qf, kf) * scale
    weight = allowed.to(wide)[None]  # 0/1, or how often a pair is covered (FFA's slices)
    probs = torch.where(weight > 0, torch.exp(scores - stats[..., None]) * weight, 0.0)
    d_v = torch.einsum("hqk,qhd->khd", probs, do)
    d_probs = torch.einsum("qhd,khd->hqk", do, vf)
    delta = (do * o).sum(-1).t()  # (Hq, Sq)
    d_scores = probs * (d_probs - delta[..., None])
    d_q = torch.einsum("hqk,khd->qhd", d_scores, kf) * scale
    d_k = torch.einsum("hqk,qhd->khd", d_scores, qf) * scale
    sk, hkv, dim = k.shape
    d_k = d_k.reshape(sk, hkv, group, dim).sum(2)
    d_v = d_v.reshape(sk, hkv, group, dim).sum(2)
    return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype)


def looks_differentiable(lse: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``lse`` as the libraries hand it out: requiring grad when an input does, its gradient
    dropped (their autograd functions' backward ignores it) — what a GPU run shows lcab."""
    anchor = sum((t.sum() * 0 for t in inputs if t.requires_grad), torch.zeros((), dtype=lse.dtype))
    return lse.detach() + anchor
