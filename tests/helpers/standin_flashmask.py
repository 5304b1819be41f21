"""Stand-in for ``interface_torch`` (FlashMask V3's torch build) in plain torch, from its source.

Built from the table `lcab.kernels.upstream.flashmask` — every function's signature is its
row's (``UpstreamFunction.signature``/``bind``) — and from the semantics of the real source at
PaddlePaddle/flash-attention 9985af53, ``flashmask/flash_mask/flashmask_attention_v3/``, not from
lcab's lowering, so lcab's adapter is contract-tested on CPU (never GPU-verified):

* ``flashmask_attention`` does the Python checks of ``interface_torch.py`` L756-952 (int32
  ``startend_row_indices`` of rank 4, shape[0] = B, shape[2] = Sk, shape[1] in {1, Hq, Hkv},
  C by ``causal``, ``FLAGS_flash_attn_version`` defaulting to "3", the NotImplementedError of
  ``FLAGS_cudnn_deterministic=1`` with head dim > 128) and calls ``FlashMaskFunc.apply``, whose
  forward calls ``flashmask_cuda.fwd`` and whose backward calls ``flashmask_cuda.bwd`` with the
  saved out and LSE, ignoring ``dlse`` (L33-100);
* the mask (`allowed`): the kernel's **absolute row intervals** per key column
  (``mainloop_fwd_sm90_tma_gmma_ws.hpp`` L1472-1545, ``flash_mask.hpp`` L50-81) and FA3's causal
  mask, bottom-right aligned (``mask.h`` L99-111), for any Sq and Sk; mask head
  ``h // (Hq / H_mask)`` for query head h (``flash_api_torch.cpp`` L1048-1049);
* ``fwd``: out (B, Sq, Hq, D) and the LSE (B, Hq, Sq), natural log, -inf on rows with no key
  (``softmax.h`` L165; ``EMPTY_LSE`` lets a test vary it), float32 (float64 for float64 inputs:
  the real kernel takes fp16/bf16 only, the stand-in also float for exact comparisons);
* ``bwd``: dq, dk, dv from the ``out`` and ``softmax_lse`` it is given (a ring step's merged
  statistics), an LSE of -inf read as 0 (``flash_bwd_preprocess_kernel.h`` L242), dk/dv summed
  over the query heads of each KV head.

``fwd`` and ``bwd`` are operators under ``torch.ops.flashmask``, defined from the schemas the
built extension registers (`SCHEMAS`, recorded from the real wheel), with CPU kernels; when the
real extension is loaded (`tests.helpers.real_wheels.load_flashmask`) the same two functions are
registered as CPU kernels of the real operators instead. Upstream's
``flashmask_attention`` is a plain function. Every call of ``fwd`` and ``bwd`` is appended to
``CALLS``.
"""

from __future__ import annotations

import os
import types
from typing import Any

import torch

from lcab.kernels.upstream.flashmask import FLASHMASK_ATTENTION, FLASHMASK_BWD, FLASHMASK_FWD
from tests.helpers import real_schemas
from tests.helpers.standin_flash_attn import module

CALLS: list[dict[str, Any]] = []
EMPTY_LSE = {"value": float("-inf")}


# ----------------------------------------------------------------------------- the mask
def allowed(indices: torch.Tensor, causal: bool, seqlen_q: int) -> torch.Tensor:
    """(H_mask, Sq, Sk) bool: what the kernel attends for ``startend_row_indices`` (batch 0)."""
    idx = indices[0].to(torch.int64)  # (H, Sk, C)
    sk, c = idx.shape[1], idx.shape[2]
    i = torch.arange(seqlen_q)[None, :, None]
    j = torch.arange(sk)[None, None, :]

    def col(n: int) -> torch.Tensor:
        return idx[:, None, :, n]  # (H, 1, Sk)

    if causal:
        lte = col(1) if c == 2 else seqlen_q
        masked = ((i >= col(0)) & (i < lte)) | (j > i + (sk - seqlen_q))
    elif c == 2:
        masked = (i >= col(0)) | (i < col(1))
    else:
        masked = ((i >= col(0)) & (i < col(1))) | ((i >= col(2)) & (i < col(3)))
    return ~masked


def allowed_of_call(call: dict[str, Any], seqlen_q: int) -> torch.Tensor:
    """The (H_mask, Sq, Sk) mask a recorded call applies."""
    return allowed(call["startend_row_indices"], call["is_causal"], seqlen_q)


def _per_query_head(indices: torch.Tensor, causal: bool, sq: int, hq: int) -> torch.Tensor:
    ok = allowed(indices, causal, sq)  # (H_mask, Sq, Sk)
    return ok.repeat_interleave(hq // ok.shape[0], 0)  # h_h_flashmask_ratio = Hq / H_mask


def _scores(a: dict[str, Any], q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Scaled scores (Hq, Sq, Sk), what is attended, and K/V-head-repeated k."""
    hq, hkv, sq = q.shape[2], k.shape[2], q.shape[1]
    assert hq % hkv == 0 and q.stride(-1) == 1 and k.stride(-1) == 1
    ok = _per_query_head(a["startend_row_indices"], a["is_causal"], sq, hq)
    kk = k[0].repeat_interleave(hq // hkv, 1)
    return torch.einsum("qhd,khd->hqk", q[0], kk) * a["softmax_scale"], ok, kk


# ----------------------------------------------------------------------------- the ops
def _fwd(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    a = FLASHMASK_FWD.bind(*args, **kwargs)
    q, k, v = a["q"], a["k"], a["v"]
    assert a["startend_row_indices"] is not None and a["block_mask"] is None
    assert (a["window_size_left"], a["window_size_right"], a["softcap"]) == (-1, -1, 0.0)
    scores, ok, _ = _scores(a, q, k)
    empty = ~ok.any(-1)  # (Hq, Sq)
    scores = scores.masked_fill(~(ok | empty[..., None]), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(empty[..., None], 0.0)
    vv = v[0].repeat_interleave(q.shape[2] // v.shape[2], 1)
    out = torch.einsum("hqk,khd->qhd", probs, vv)[None].to(q.dtype)
    lse = lse.masked_fill(empty, EMPTY_LSE["value"])[None]
    lse = lse.to(torch.promote_types(q.dtype, torch.float32))
    CALLS.append({"op": "fwd", **a, "lse": lse})
    return out, lse


def _bwd(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = FLASHMASK_BWD.bind(*args, **kwargs)
    dout, q, k, v, out, lse = (a[n] for n in ("dout", "q", "k", "v", "out", "softmax_lse"))
    assert lse.shape == (1, q.shape[2], q.shape[1]), "softmax_lse is (B, Hq, Sq)"
    assert dout.shape == out.shape == q.shape and a["dq"] is None
    CALLS.append({"op": "bwd", **a})
    scores, ok, kk = _scores(a, q, k)
    stats = lse[0].masked_fill(torch.isneginf(lse[0]), 0.0)  # -inf is read as 0
    probs = torch.exp(scores - stats[..., None]).masked_fill(~ok, 0.0)
    group = q.shape[2] // k.shape[2]
    vv = v[0].repeat_interleave(group, 1)
    d_o, o = dout[0], out[0]
    delta = (d_o * o).sum(-1).t()  # (Hq, Sq)
    dp = torch.einsum("qhd,khd->hqk", d_o, vv)
    ds = probs * (dp - delta[..., None])
    dq = torch.einsum("hqk,khd->qhd", ds, kk) * a["softmax_scale"]
    dk = torch.einsum("hqk,qhd->khd", ds, q[0]) * a["softmax_scale"]
    dv = torch.einsum("hqk,qhd->khd", probs, d_o)
    dk, dv = (t.unflatten(1, (k.shape[2], group)).sum(2) for t in (dk, dv))
    return dq[None].to(q.dtype), dk[None].to(q.dtype), dv[None].to(q.dtype)


RECORDED = real_schemas.load("flashmask")["operators"]
SCHEMAS = {
    name: RECORDED[f"flashmask::{name}"]["schema"].removeprefix("flashmask::")
    for name in ("fwd", "bwd")
}
"""The schemas of ``torch.ops.flashmask.fwd``/``bwd`` as the built extension registers them
(``TORCH_LIBRARY(flashmask, m)``, ``flash_api_torch.cpp`` L1651-1714 at 9985af53), read from
the wheel ``launchers/kernel_build.sh`` builds (``tests/unit/data/real_schemas/flashmask.json``):
the stand-in's ops are defined by them, so their parameters, defaults and mutated arguments are
the real ones (and the table rows are held to them)."""


def _define_ops() -> Any:
    """``torch.ops.flashmask`` with ``fwd`` and ``bwd`` as the extension registers them — C++
    ``TORCH_LIBRARY`` ops, not Python custom ops — with this module's CPU kernels (upstream has
    CUDA ones only, ``TORCH_LIBRARY_IMPL(flashmask, CUDA, m)`` L1716-1719)."""
    if not hasattr(torch.ops.flashmask, "bwd"):  # defined once per process
        library = torch.library.Library("flashmask", "DEF")
        for name, impl in (("fwd", _fwd), ("bwd", _bwd)):
            library.define(SCHEMAS[name])
            library.impl(name, impl, "CPU")
        _LIBRARIES.append(library)  # a Library unregisters its ops when collected
    return torch.ops.flashmask


_LIBRARIES: list[Any] = []
flashmask_cuda = _define_ops()
"""``interface_torch.flashmask_cuda = torch.ops.flashmask`` (L31)."""


class FlashMaskFunc(torch.autograd.Function):
    """``interface_torch.FlashMaskFunc``: fwd, and bwd on the saved (out, lse); dlse unused."""

    @staticmethod
    def forward(ctx, q, k, v, startend_row_indices, block_mask, softmax_scale, causal,
                window_size_left, window_size_right, softcap, deterministic):  # fmt: skip
        out, lse = flashmask_cuda.fwd(
            q=q, k=k, v=v, startend_row_indices=startend_row_indices, block_mask=block_mask,
            softmax_scale=softmax_scale, is_causal=causal, window_size_left=window_size_left,
            window_size_right=window_size_right, softcap=softcap,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, startend_row_indices)
        ctx.kw = {"softmax_scale": softmax_scale, "is_causal": causal,
                  "deterministic": deterministic}  # fmt: skip
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, indices = ctx.saved_tensors
        dq, dk, dv = flashmask_cuda.bwd(
            dout=dout.contiguous(), q=q, k=k, v=v, out=out, softmax_lse=lse,
            startend_row_indices=indices, **ctx.kw,
        )  # fmt: skip
        return dq, dk, dv, *([None] * 8)


def _flashmask_attention(*args: Any, **kwargs: Any) -> Any:
    a = FLASHMASK_ATTENTION.bind(*args, **kwargs)
    q, k, v, idx = a["query"], a["key"], a["value"], a["startend_row_indices"]
    assert a["window_size"] is None and a["block_mask"] is None
    if idx is None:
        raise ValueError("startend_row_indices cannot be None when calling flashmask_attention")
    assert idx.dtype == torch.int32 and idx.dim() == 4 and idx.device == q.device
    assert idx.shape[0] == k.shape[0] and idx.shape[2] == k.shape[1]
    assert idx.shape[1] in (1, q.shape[2], k.shape[2])
    if idx.shape[-1] not in ((1, 2) if a["causal"] else (2, 4)):
        raise ValueError(f"Invalid shape of startend_row_indices: {tuple(idx.shape)}")
    version = int(os.getenv("FLAGS_flash_attn_version", "3"))  # noqa: SIM112 (its name)
    deterministic = os.getenv("FLAGS_cudnn_deterministic", "0") == "1"  # noqa: SIM112
    fa_version = 2 if version == 3 and deterministic and q.shape[3] > 128 else version
    if fa_version == 2:
        raise NotImplementedError("FlashMask is not supported. Please use FlashMask V3.")
    if fa_version != 3:
        raise ValueError(f"Invalid flash attention version: {fa_version}")
    assert a["dropout"] == 0.0 and not a["return_seed_offset"] and a["training"]
    assert a["fixed_seed_offset"] is None and a["rng_name"] == "" and a["name"] is None
    scale = a["softmax_scale"] if a["softmax_scale"] is not None else q.shape[-1] ** -0.5
    out, lse = FlashMaskFunc.apply(q, k, v, idx, None, scale, a["causal"], -1, -1, 0.0,
                                   deterministic)  # fmt: skip
    return [out, lse] if a["return_softmax_lse"] else out


flashmask_attention = _flashmask_attention
flashmask_attention.__signature__ = FLASHMASK_ATTENTION.signature()  # type: ignore[attr-defined]


def flashmask_attention_without_lse(
    query, key, value, startend_row_indices=None, *, causal=False, softmax_scale=None
):  # fmt: skip
    """A build whose call has no return_softmax_lse."""
    raise AssertionError("the probe must refuse this build before any call")


def flashmask_module(**overrides: Any) -> types.ModuleType:
    """Stand-in ``interface_torch``; ``overrides`` replace its attributes."""
    attrs = {
        "flashmask_attention": flashmask_attention,
        "flashmask_cuda": flashmask_cuda,
        "FlashMaskFunc": FlashMaskFunc,
    }
    return module(FLASHMASK_ATTENTION.module, **(attrs | overrides))
