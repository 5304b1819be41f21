"""Stand-in for ``torch.nn.attention.varlen`` (CUDA only) in plain torch, built from the table.

Its signature is the table row's (`lcab.kernels.upstream.torch_attention.VARLEN_ATTN`), which
``tests/unit/test_upstream_torch_attention.py`` holds to the installed torch, and its LSE comes
back in the row's layout — (H_q, T_q), what torch's own fake kernel of ``varlen_attn`` returns
(``torch/nn/attention/varlen.py`` L135-173) — so this stand-in cannot share a misreading with
the adapter: both read the same row, and the row is checked against torch itself.

``_varlen_attn_backward`` (row ``VARLEN_BACKWARD_OP``, ``varlen.py`` L507-635) computes the
gradients from the ``out`` and ``lse`` it is given, as FlashAttention's backward does
(`tests.helpers.standin_rows.flash_backward_math`: an LSE of -inf read as 0), on the attended
set of the same window rule — what the adapter's backward from merged statistics calls.

What the numbers follow (torch 2.13's ``varlen_attn``, L176-326): packed (T, H, D) inputs,
``cu_seq_q``/``cu_seq_k`` int32, causal when ``window_size == (-1, 0)`` and a window otherwise,
a ValueError when the head counts differ without ``enable_gqa``; the attended set of each
sequence is FlashAttention's window rule (`tests.helpers.standin_flash_attn.varlen_allowed`,
equal lengths only: lcab refuses the rest). The LSE of a row attending no key is undocumented:
+inf here, which lcab must not rely on. The LSE is detached (torch's backward ignores its
gradient). Every call is appended to ``CALLS``.
"""

from __future__ import annotations

import math
import types
from typing import Any, NamedTuple

import torch

from lcab.kernels.upstream.torch_attention import (
    VARLEN_ATTN,
    VARLEN_AUX_REQUEST,
    VARLEN_BACKWARD_OP,
)
from tests.helpers.standin_flash_attn import _attend, varlen_allowed
from tests.helpers.standin_rows import flash_backward_math, from_row

CALLS: list[dict[str, Any]] = []


class AuxRequest(NamedTuple):
    """torch's ``AuxRequest`` (a NamedTuple of one field, ``lse``, default False)."""

    lse: bool = VARLEN_AUX_REQUEST.defaults["lse"]


def _varlen_attn(*args: Any, **kwargs: Any) -> Any:
    a = VARLEN_ATTN.bind(*args, **kwargs)  # a TypeError where torch's would raise one
    q, k, v = a["query"], a["key"], a["value"]
    assert q.dim() == 3 and a["cu_seq_q"].dtype == torch.int32 and isinstance(a["max_q"], int)
    assert a["seqused_k"] is None and a["block_table"] is None
    if not a["enable_gqa"] and q.shape[1] != k.shape[1]:
        raise ValueError("Expect query and key/value to have the same number of heads")
    window = tuple(a["window_size"])
    CALLS.append({"cu_q": a["cu_seq_q"], "cu_k": a["cu_seq_k"], "window_size": window, **a})
    allowed = varlen_allowed(a["cu_seq_q"], a["cu_seq_k"], False, window)  # (-1, 0) = causal
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse, empty = _attend(q, k, v, allowed, scale)  # lse (H_q, T_q)
    lse = lse.masked_fill(empty[None, :], float("inf"))  # float32 (float64 for float64 inputs)
    assert VARLEN_ATTN.lse is not None and VARLEN_ATTN.lse.layout == "ht"
    aux = a["return_aux"]
    return (out, lse.contiguous()) if aux is not None and aux.lse else out


varlen_attn = _varlen_attn
varlen_attn.__signature__ = VARLEN_ATTN.signature()  # type: ignore[attr-defined]


def _backward(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, lse = a["query"], a["lse"]
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.is_contiguous(), "lse is (H_q, T_q)"
    assert a["rng_state"].dtype == torch.uint64 and a["rng_state"].shape == (2,)
    window = tuple(a["window_size"]) if a["window_size"] is not None else (-1, -1)
    assert a["is_causal"] == (window == (-1, 0)), "varlen_attn derives is_causal from the window"
    CALLS.append({"fn": "backward", **a})
    allowed = varlen_allowed(a["cu_seq_q"], a["cu_seq_k"], False, window)
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    return flash_backward_math(
        a["grad_out"], q, a["key"], a["value"], a["out"], lse, allowed, scale
    )


_varlen_attn_backward = from_row(VARLEN_BACKWARD_OP, _backward)


def varlen_module() -> types.SimpleNamespace:
    """What the adapter takes from ``torch.nn.attention.varlen``: the function, AuxRequest and
    the backward op's function."""
    return types.SimpleNamespace(
        varlen_attn=varlen_attn, AuxRequest=AuxRequest, _varlen_attn_backward=_varlen_attn_backward
    )
