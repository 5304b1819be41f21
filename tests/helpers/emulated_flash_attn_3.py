"""A CPU emulation of FA3's compiled operators ``flash_attn_3::fwd`` and ``flash_attn_3::bwd``.

FA3's Python (``hopper/flash_attn_interface.py``) ends where it calls ``torch.ops.flash_attn_3.fwd``
and ``.bwd``, which ``flash_api_stable.cpp`` defines (``STABLE_TORCH_LIBRARY``, L1892-1981) and
implements for CUDA only (L1983-1988). These two functions are CPU kernels for those very
operators — registered on the real ones when the built wheel is loaded
(`tests.helpers.real_fa3`), or on operators defined from the recorded schemas otherwise
(`tests.helpers.recorded_fa3`) — so the library's own Python, custom ops, autograd and padding
run for real and only the CUDA kernels are replaced. Lines cite ``hopper/flash_api_stable.cpp``
at Dao-AILab/flash-attention 0251105a (the commit ``launchers/kernel_build.sh`` builds):

* arguments in the schema's order with the schema's defaults (the dispatcher passes them
  positionally and leaves out trailing ones at their defaults): ``mha_fwd`` (L741-777, 34
  arguments; schema L1893-1927) and ``mha_bwd`` (L1338-1361, 22 arguments; L1928-1950);
* checks, with the C++'s messages: fp16/bf16 (L784), k, v (out, dout) of q's dtype (L790-791,
  L1374-1377), contiguous last dimension (L795-797, L1382-1386), int32 cu_seqlens with a
  max_seqlen (L813-822, L1393-1402), head dim at most the build's largest (128 here, L847-848)
  and a multiple of 8 (L923, L1420), Hq a multiple of Hkv (L849), dq/dk/dv of q's dtype, last
  dimension contiguous and shaped like q/k/v (bwd L1503-1531); and what the restricted build
  (`BUILD`) refuses at run time: FP16 (L397), softcap (L1219), splits (L1222), pack_gqa on
  sm90 (L1225), paged KV (L1228), appended KV (L1231);
* the window, in the C++'s order: a side ≥ seqlen - 1 becomes -1 (L864-865, L1431-1432), a
  one-query call with no window is not causal (L867-871), causal sets right = 0 (L873, L1433);
  the kernel's mask is bottom-right aligned and -1 never binds (``set_params_fprop`` L210-223);
* the LSE: float32, (B, H, Sq) dense or (H, total_q) varlen (L954-958), -inf on a row that
  attends no key (``softmax.h`` L151, ``epilogue_fwd.hpp`` L441) and +inf everywhere when
  seqlen_k is 0 (L1261-1263). The backward reads it raw with no check at all (mha_bwd has no
  CHECK on softmax_lse): a GPU would read a wrong one silently, so the emulation refuses any
  LSE that is not float32, contiguous and of that shape — loudly, with the reason;
* returns: fwd ``(out, softmax_lse, out_accum, softmax_lse_accum)`` (L1267; the accumulators are
  undefined without splits: empty tensors here, which the Python turns into the same), bwd
  ``(softmax_d, softmax_lse_log2, dq_accum, dk_accum, dv_accum)`` (L1638) having filled the dq,
  dk, dv it was given.

Not computed, refused instead: rotary, q_v, descales, paged KV, appended KV, seqused, leftpad,
attention_chunk, scheduler metadata. As in FA2's emulation, `ALLOW_FLOAT64` admits float64
inputs for exact comparisons (LSE and accumulators then float64; the real kernels take
fp16/bf16 only). The attention is the definition; the backward is FlashAttention's algorithm
from (out, lse) (`tests.helpers.standin_rows.flash_backward_math`). Calls go to ``CALLS``.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.helpers.emulated_flash_attn_2_cuda import TorchCheckError, _allowed, _segments
from tests.helpers.standin_rows import flash_backward_math

ALLOW_FLOAT64 = True
"""Accept float64 inputs (CPU only; see the module docstring)."""
BUILD = {"max_headdim": 128, "fp16": False, "softcap": False, "split": False, "packgqa": False}
"""What the wheel ``launchers/kernel_build.sh`` builds refuses at run time (its recipe's flags)."""
CALLS: list[dict[str, Any]] = []


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise TorchCheckError(message)


def _refuse(**features: Any) -> None:
    """Inputs the emulation does not compute: refused, never ignored."""
    for name, value in features.items():
        if value not in (None, 0, 0.0, False):
            raise NotImplementedError(f"emulated flash_attn_3: {name}={value!r}")


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _dtypes(q: torch.Tensor, **others: torch.Tensor) -> None:
    halves = {torch.float16, torch.bfloat16} | ({torch.float64} if ALLOW_FLOAT64 else set())
    _check(q.dtype in halves, "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type")
    _check(BUILD["fp16"] or q.dtype != torch.float16, "This flash attention build does not "
           "support FP16.")  # fmt: skip
    for name, t in others.items():
        _check(t.dtype == q.dtype, f"query and {name} must have the same dtype")


def _last_dim(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        _check(t.stride(-1) == 1, f"{name} tensor must have contiguous last dimension")


def _shape(name: str, t: torch.Tensor, *shape: int) -> None:
    _check(tuple(t.shape) == shape, f"{name} dimension mismatch: {tuple(t.shape)} vs {shape}")


def _heads(q: torch.Tensor, k: torch.Tensor) -> None:
    head_size, limit = q.shape[-1], BUILD["max_headdim"]
    _check(head_size <= limit, f"FlashAttention forward only supports head dimension at most "
           f"{limit}")  # fmt: skip
    _check(q.shape[-2] % k.shape[-2] == 0, "Number of heads in key/value must divide number of "
           "heads in query")  # fmt: skip
    _check(head_size % 8 == 0, "head_size should be a multiple of 8")


def _varlen(name: str, cu: torch.Tensor | None, longest: int | None) -> int | None:
    """Batch size of a varlen side (None: dense), checked as L813-822 / L1393-1402 do."""
    if cu is None:
        return None
    _check(cu.dtype == torch.int32, f"{name} must have dtype torch.int32")
    _check(cu.is_contiguous(), f"{name} must be contiguous")
    _check(longest is not None, f"max_seqlen_{name[-1]} must be provided if {name} is provided")
    return cu.numel() - 1


def _window(left: int, right: int, causal: bool, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """The rewrite of L864-873 (L1431-1433): what the kernel's mask applies, -1 unbounded."""
    left = -1 if left >= seqlen_k - 1 else left
    right = -1 if right >= seqlen_q - 1 else right
    if seqlen_q == 1 and left == -1 and right == -1:
        causal = False  # L867-871 (no paged KV)
    return left, 0 if causal else right


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed q (Sq, Hq, D), k/v (Sk, Hkv, D) → out in q's dtype, lse (Hq, Sq), -inf if empty."""
    wide = _wide(q.dtype)
    group = q.shape[1] // k.shape[1]
    kk, vv = (t.to(wide).repeat_interleave(group, 1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.to(wide), kk) * scale
    lse = torch.logsumexp(scores.masked_fill(~allowed[None], float("-inf")), -1)
    empty = torch.isneginf(lse)
    probs = torch.exp(scores - lse.masked_fill(empty, 0.0)[..., None]) * allowed[None]
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    return out.to(q.dtype), lse.to(wide)


def fwd(
    q, k, v, k_new=None, v_new=None, q_v=None, out_=None, cu_seqlens_q=None, cu_seqlens_k=None,
    cu_seqlens_k_new=None, seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
    page_table=None, kv_batch_idx=None, leftpad_k=None, rotary_cos=None, rotary_sin=None,
    seqlens_rotary=None, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
    is_causal=False, window_size_left=-1, window_size_right=-1, attention_chunk=0, softcap=0.0,
    is_rotary_interleaved=False, scheduler_metadata=None, num_splits=0, pack_gqa=None,
    sm_margin=0,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """``mha_fwd``: (out, softmax_lse, out_accum, softmax_lse_accum)."""
    _refuse(
        q_v=q_v, cu_seqlens_k_new=cu_seqlens_k_new, seqused_q=seqused_q, seqused_k=seqused_k,
        kv_batch_idx=kv_batch_idx, leftpad_k=leftpad_k, rotary_cos=rotary_cos,
        rotary_sin=rotary_sin, seqlens_rotary=seqlens_rotary, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, attention_chunk=attention_chunk,
        scheduler_metadata=scheduler_metadata, out_=out_,
    )  # fmt: skip
    _check(page_table is None, "This flash attention build does not support paged KV.")
    _check(k_new is None and v_new is None, "This flash attention build does not support "
           "appending KV.")  # fmt: skip
    _check(BUILD["softcap"] or softcap == 0.0, "This flash attention build does not support "
           "tanh softcapping.")  # fmt: skip
    _check(BUILD["split"] or num_splits in (0, 1), "This flash attention build does not "
           "support splits.")  # fmt: skip
    _check(BUILD["packgqa"] or not pack_gqa, "This flash attention build does not support "
           "pack_gqa.")  # fmt: skip
    _dtypes(q, key=k, value=v)
    _last_dim(Input=q, key=k, value=v)
    batch_q = _varlen("cu_seqlens_q", cu_seqlens_q, max_seqlen_q)
    batch_k = _varlen("cu_seqlens_k", cu_seqlens_k, max_seqlen_k)
    _check((batch_q is None) == (batch_k is None), "emulation: varlen q and k together only")
    _heads(q, k)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    if batch_q is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        _check(k.shape[0] == batch, "batch_size must be equal to batch_size_k")
    else:
        batch, seqlen_q, seqlen_k = batch_q, int(max_seqlen_q), int(max_seqlen_k)
        _check(batch_k == batch, "batch_size must be equal to batch_size_k")
        _shape("cu_seqlens_q", cu_seqlens_q, batch + 1)
    window = _window(window_size_left, window_size_right, is_causal, seqlen_q, seqlen_k)
    if batch_q is None:
        results = [
            _attend(q[b], k[b], v[b], _allowed(seqlen_q, seqlen_k, window), scale)
            for b in range(batch)
        ]
        out = torch.stack([r[0] for r in results])
        lse = torch.stack([r[1] for r in results])  # (B, H, Sq)
    else:
        out, lse = _attend(q, k, v, _segments(cu_seqlens_q, cu_seqlens_k, window), scale)
    if seqlen_k == 0:  # L1261-1263
        out, lse = out.zero_(), lse.fill_(float("inf"))
    CALLS.append({"fn": "fwd", "window": window, "causal": is_causal, "lse": lse})
    empty = torch.empty(0, dtype=torch.float32)
    return out, lse, empty, empty.clone()


def _lse(lse: torch.Tensor, q: torch.Tensor, *shape: int) -> None:
    """The LSE the kernel reads through data_ptr(): anything else is wrong there, silently."""
    want = _wide(q.dtype)
    if lse.dtype != want or tuple(lse.shape) != shape or not lse.is_contiguous():
        raise TorchCheckError(
            f"softmax_lse {tuple(lse.shape)} {lse.dtype} contiguous={lse.is_contiguous()}: "
            f"mha_bwd reads it as {shape} {want} contiguous without a check, so a GPU would "
            "compute wrong gradients here without an error"
        )


def _grad(name: str, given: torch.Tensor | None, like: torch.Tensor, q: torch.Tensor):
    if given is None:
        return torch.empty_like(like)
    _check(given.dtype == q.dtype, f"{name} must have the same dtype as q")
    _check(given.stride(-1) == 1, f"{name} must have contiguous last dimension")
    _shape(name, given, *like.shape)
    return given


def bwd(
    dout, q, k, v, out, softmax_lse, dq=None, dk=None, dv=None, cu_seqlens_q=None,
    cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
    softmax_scale=None, is_causal=False, window_size_left=-1, window_size_right=-1, softcap=0.0,
    deterministic=False, sm_margin=0,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """``mha_bwd``: fills dq, dk, dv; (softmax_d, softmax_lse_log2, dq/dk/dv accumulators)."""
    _refuse(seqused_q=seqused_q, seqused_k=seqused_k)
    _check(BUILD["softcap"] or softcap == 0.0, "This flash attention build does not support "
           "tanh softcapping.")  # fmt: skip
    _dtypes(q, key=k, value=v, out=out, dout=dout)
    _last_dim(Input=q, key=k, value=v, out=out, dout=dout)
    batch_q = _varlen("cu_seqlens_q", cu_seqlens_q, max_seqlen_q)
    batch_k = _varlen("cu_seqlens_k", cu_seqlens_k, max_seqlen_k)
    _check((batch_q is None) == (batch_k is None), "emulation: varlen q and k together only")
    _heads(q, k)
    for name, t in (("out", out), ("dout", dout)):
        _shape(name, t, *q.shape)
    grads = [_grad(n, g, t, q) for n, g, t in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v))]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    wide = _wide(q.dtype)
    if batch_q is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        _lse(softmax_lse, q, batch, q.shape[2], seqlen_q)
        window = _window(window_size_left, window_size_right, is_causal, seqlen_q, seqlen_k)
        allowed = _allowed(seqlen_q, seqlen_k, window)
        for b in range(batch):
            computed = flash_backward_math(
                dout[b], q[b], k[b], v[b], out[b], softmax_lse[b], allowed, scale
            )
            for target, grad in zip(grads, computed, strict=True):
                target[b].copy_(grad)
        delta = (dout.to(wide) * out.to(wide)).sum(-1).transpose(1, 2)  # (B, H, Sq)
    else:
        seqlen_q, seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        _lse(softmax_lse, q, q.shape[1], q.shape[0])
        window = _window(window_size_left, window_size_right, is_causal, seqlen_q, seqlen_k)
        allowed = _segments(cu_seqlens_q, cu_seqlens_k, window)
        computed = flash_backward_math(dout, q, k, v, out, softmax_lse, allowed, scale)
        for target, grad in zip(grads, computed, strict=True):
            target.copy_(grad)
        delta = (dout.to(wide) * out.to(wide)).sum(-1).t()  # (H, total_q)
    CALLS.append({"fn": "bwd", "window": window, "causal": is_causal, "lse": softmax_lse})
    empty = torch.empty(0, dtype=torch.float32)
    return delta.contiguous(), empty, empty.clone(), empty.clone(), empty.clone()
