"""A CPU emulation of ``flash_attn_2_cuda``, flash-attn 2.8.3.post2's compiled extension.

flash-attn's own Python (``flash_attn/flash_attn_interface.py``) ends where it calls
``flash_attn_gpu.fwd``, ``varlen_fwd``, ``bwd`` and ``varlen_bwd``; those four are what this
module provides, following ``csrc/flash_attn/flash_api.cpp`` of the same sdist (line numbers
below are that file's; ``tests/helpers/emulated_flash_attn.py`` imports the library's files
unchanged over it):

* the pybind11 argument order of ``mha_fwd`` (L350-363), ``mha_varlen_fwd`` (L514-535),
  ``mha_bwd`` (L767-786) and ``mha_varlen_bwd`` (L973-997), positional only (pybind11 takes no
  keywords there), registered as ``fwd``/``varlen_fwd``/``bwd``/``varlen_bwd`` (L1480-1483);
* the checks the C++ makes, with its messages: q fp16/bf16 and k, v (out, dout) of q's dtype
  (L373-376, L545-548, L804-809, L1015-1020), last dimension contiguous (L380-382, L565-567,
  L814-818, L1028-1032), int32 contiguous cu_seqlens (L549-550, L568-569, L1021-1022,
  L1033-1034), head_size % 8 == 0 and <= 256 (L393-394, L604-605, L829-830, L1045-1046), Hq a
  multiple of Hkv (L395, L606, L831, L1047), the shapes (L416-418, L611-623, L843-847,
  L1058-1064) and dq/dk/dv of q's dtype, contiguous last dim and shape (L852-873, L1069-1090);
* the window and causal rewrites, in the C++'s order: forward ``seqlen_q == 1`` → not causal
  (L403, L585), causal → right 0 (L404, L586, L791, L1002), a side ≥ seqlen_k (max_seqlen_k for
  varlen) → -1 (L399-400, L608-609, L840-841, L1055-1056), then in ``set_params_fprop``
  (L139-142) an unbounded side facing a bounded one → seqlen_k; the swapped GQA path of one
  query per sequence (L408-414, L592-600) reshapes q, which fails when a varlen batch has a
  sequence of other than one query;
* the LSE: returned float32, (B, H, Sq) dense (L441) and (H, total_q) varlen (L652), +inf on
  rows that attend no key (``src/softmax.h``: ``sum == 0`` → INFINITY) and when seqlen_k is 0
  (L503, L743); the backward reads it raw through ``softmax_lse.data_ptr()`` (L923, L1151) with
  no check of dtype, shape or layout (only the device, L812, L1025). A GPU would read a wrong
  one silently, so the emulation refuses any LSE that is not float32, contiguous and of exactly
  that shape — loudly, with the reason.

What the emulation does *not* take, raising instead of guessing: dropout, ALiBi, softcap,
paged KV (``block_table``), ``seqused_k``, ``leftpad_k``, a preallocated ``out``.

One departure, for exact comparisons only: with `ALLOW_FLOAT64` (the default) float64 inputs
are accepted and computed in float64, the LSE is then float64 and the backward demands float64
(the accumulation type of the inputs, as float32 is for fp16/bf16). The real kernels take
fp16/bf16 only; tests that set ``ALLOW_FLOAT64 = False`` see the C++'s refusal.

The attention itself is the definition (softmax over the allowed keys, GQA by query groups) and
the backward is FlashAttention's algorithm from (out, lse)
(`tests.helpers.standin_rows.flash_backward_math`). Every call is appended to ``CALLS``.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.helpers.standin_rows import flash_backward_math

ALLOW_FLOAT64 = True
"""Accept float64 inputs (CPU only; see the module docstring)."""
FLOAT32_LSE = False
"""Return and demand a float32 LSE for float64 inputs too, as the kernels' ``float`` LSE is
(a test sets it: lcab must hand back the dtype the forward gave, whatever it was)."""
CALLS: list[dict[str, Any]] = []


class TorchCheckError(RuntimeError):
    """A ``TORCH_CHECK`` of ``flash_api.cpp`` failing (on a GPU: a ``RuntimeError`` too)."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise TorchCheckError(message)


def _unsupported(**features: Any) -> None:
    """Features the emulation does not compute: refused, never ignored."""
    for name, value in features.items():
        if value not in (None, 0.0, 0, False):
            raise NotImplementedError(f"emulated flash_attn_2_cuda: {name}={value!r}")


def _dtypes(q: torch.Tensor, **others: torch.Tensor) -> None:
    allowed = {torch.float16, torch.bfloat16} | ({torch.float64} if ALLOW_FLOAT64 else set())
    _check(q.dtype in allowed, "FlashAttention only support fp16 and bf16 data type")
    for name, t in others.items():
        _check(t.dtype == q.dtype, f"query and {name} must have the same dtype")


def _last_dim(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        _check(t.stride(-1) == 1, f"{name} must have contiguous last dimension")


def _shape(name: str, t: torch.Tensor, *shape: int) -> None:
    _check(tuple(t.shape) == shape, f"{name} must have shape {shape}, not {tuple(t.shape)}")


MULTIPLE_OF_8 = {
    False: "query, key, value, and out_ must have a head_size that is a multiple of 8",
    True: "head_size should be a multiple of 8",
}
HEADS_DIVIDE = "Number of heads in key/value must divide number of heads in query"


def _heads(q: torch.Tensor, k: torch.Tensor, backward: bool) -> None:
    head_size = q.shape[-1]
    _check(head_size % 8 == 0, MULTIPLE_OF_8[backward])
    _check(head_size <= 256, "FlashAttention only supports head dimension at most 256")
    _check(q.shape[-2] % k.shape[-2] == 0, HEADS_DIVIDE)


def _cu(name: str, cu: torch.Tensor, batch: int | None = None) -> int:
    _check(cu.dtype == torch.int32, f"{name} must have dtype int32")
    _check(cu.is_contiguous(), f"{name} must be contiguous")
    if batch is not None:
        _shape(name, cu, batch + 1)
    return cu.numel() - 1


def _window(left: int, right: int, seqlen_k: int) -> tuple[int, int]:
    """The ≥ seqlen_k rewrite (L399-400 etc.) and then ``set_params_fprop``'s (L141-142)."""
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    if left < 0 <= right:
        left = seqlen_k
    if left >= 0 > right:
        right = seqlen_k
    return left, right


def _allowed(sq: int, sk: int, window: tuple[int, int]) -> torch.Tensor:
    """(sq, sk) bool: the kernel's mask, its diagonal bottom-right aligned (-1 = unbounded)."""
    left, right = window
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i + sk - sq - left
    if right >= 0:
        ok &= j <= i + sk - sq + right
    return ok


def _segments(cu_q: torch.Tensor, cu_k: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """(total_q, total_k) bool: each sequence under `_allowed`, none across sequences."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    allowed = torch.zeros(cq[-1], ck[-1], dtype=torch.bool)
    for b in range(len(cq) - 1):
        allowed[cq[b] : cq[b + 1], ck[b] : ck[b + 1]] = _allowed(
            cq[b + 1] - cq[b], ck[b + 1] - ck[b], window
        )
    return allowed


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The kernels' accumulation type: float32 (float64 for float64 inputs, CPU only)."""
    return torch.promote_types(dtype, torch.float32)


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The LSE's dtype, returned and demanded: `_wide`, or float32 under `FLOAT32_LSE`."""
    return torch.float32 if FLOAT32_LSE else _wide(dtype)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed q (Sq, Hq, D), k/v (Sk, Hkv, D) → out (Sq, Hq, D) in q's dtype, lse (Hq, Sq)."""
    wide = _wide(q.dtype)
    group = q.shape[1] // k.shape[1]
    kk = k.to(wide).repeat_interleave(group, 1)
    vv = v.to(wide).repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.to(wide), kk) * scale
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(scores, -1)  # -inf where a row attends nothing
    empty = torch.isneginf(lse)
    probs = torch.exp(scores - lse.masked_fill(empty, 0.0)[..., None])
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    lse = lse.masked_fill(empty, float("inf"))  # softmax.h: sum 0 → +inf
    return out.to(q.dtype), lse.to(_lse_dtype(q.dtype))


def _result(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``p`` (empty without return_softmax, L447) and ``rng_state`` (2,) int64."""
    return torch.empty(0, dtype=q.dtype), torch.zeros(2, dtype=torch.int64)


def fwd(
    q, k, v, out_, alibi_slopes, p_dropout, softmax_scale, is_causal, window_size_left,
    window_size_right, softcap, return_softmax, gen, /,
) -> list[torch.Tensor]:  # fmt: skip
    """``mha_fwd`` (L350-511): [out, softmax_lse (B, H, Sq) float32, p, rng_state]."""
    _unsupported(out_=out_, alibi_slopes=alibi_slopes, p_dropout=p_dropout, softcap=softcap)
    _check(not return_softmax, "return_softmax is only supported when p_dropout > 0.0")
    _dtypes(q, key=k, value=v)
    _last_dim(q=q, k=k, v=v)
    batch, seqlen_q, heads, head_size = q.shape
    seqlen_k, heads_k = k.shape[1], k.shape[2]
    _check(batch > 0, "batch size must be positive")
    _heads(q, k, backward=False)
    left, right = window_size_left, window_size_right
    left, right = (-1 if left >= seqlen_k else left), (-1 if right >= seqlen_k else right)
    is_causal = is_causal and seqlen_q != 1  # L403
    right = 0 if is_causal else right  # L404
    _shape("q", q, batch, seqlen_q, heads, head_size)
    _shape("k", k, batch, seqlen_k, heads_k, head_size)
    _shape("v", v, batch, seqlen_k, heads_k, head_size)
    window = _window(left, right, seqlen_k)
    outs, lses = [], []
    for b in range(batch):
        out, lse = _attend(q[b], k[b], v[b], _allowed(seqlen_q, seqlen_k, window), softmax_scale)
        outs.append(out)
        lses.append(lse)
    out, lse = torch.stack(outs), torch.stack(lses)
    CALLS.append({"fn": "fwd", "window": window, "lse": lse})
    return [out, lse, *_result(q)]


def varlen_fwd(
    q, k, v, out_, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
    max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal,
    window_size_left, window_size_right, softcap, return_softmax, gen, /,
) -> list[torch.Tensor]:  # fmt: skip
    """``mha_varlen_fwd`` (L514-754): [out, softmax_lse (H, total_q) float32, p, rng_state]."""
    _unsupported(
        out_=out_, seqused_k=seqused_k, leftpad_k=leftpad_k, block_table=block_table,
        alibi_slopes=alibi_slopes, p_dropout=p_dropout, softcap=softcap,
    )  # fmt: skip
    _check(not return_softmax, "return_softmax is only supported when p_dropout > 0.0")
    _dtypes(q, key=k, value=v)
    batch = _cu("cu_seqlens_q", cu_seqlens_q)
    _cu("cu_seqlens_k", cu_seqlens_k)
    _last_dim(q=q, k=k, v=v)
    left, right = window_size_left, window_size_right
    is_causal = is_causal and max_seqlen_q != 1  # L585
    right = 0 if is_causal else right  # L586
    total_q, heads, head_size = q.shape
    heads_k = k.shape[1]
    swapped = max_seqlen_q == 1 and heads > heads_k and left < 0 and right < 0  # L592
    # L595: q.reshape({batch, heads_k, ngroups, head_size}) needs one query per sequence
    shape = [batch, heads_k, heads // heads_k, head_size]
    _check(not swapped or total_q == batch, f"shape {shape} is invalid for input of {q.numel()}")
    _check(batch > 0, "batch size must be positive")
    _heads(q, k, backward=False)
    left = -1 if left >= max_seqlen_k else left  # L608-609
    right = -1 if right >= max_seqlen_k else right
    _shape("q", q, total_q, heads, head_size)
    _shape("k", k, k.shape[0], heads_k, head_size)
    _shape("v", v, k.shape[0], heads_k, head_size)
    _cu("cu_seqlens_q", cu_seqlens_q, batch)
    _cu("cu_seqlens_k", cu_seqlens_k, batch)
    window = _window(left, right, max_seqlen_k)
    allowed = _segments(cu_seqlens_q, cu_seqlens_k, window)
    out, lse = _attend(q, k, v, allowed, softmax_scale)
    if max_seqlen_k == 0:  # L740-744
        out, lse = out.zero_(), lse.fill_(float("inf"))
    CALLS.append({"fn": "varlen_fwd", "window": window, "lse": lse})
    return [out, lse, *_result(q)]


def _lse(lse: torch.Tensor, q: torch.Tensor, *shape: int) -> None:
    """The LSE a GPU would read raw (L923, L1151): anything else is wrong there, silently."""
    what = f"softmax_lse {tuple(lse.shape)} {lse.dtype} contiguous={lse.is_contiguous()}"
    want = f"{shape} {_lse_dtype(q.dtype)} contiguous"
    if lse.dtype != _lse_dtype(q.dtype) or tuple(lse.shape) != shape or not lse.is_contiguous():
        raise TorchCheckError(
            f"{what}: the kernel reads it through data_ptr() as {want} without a check, so a "
            "GPU would compute wrong gradients here without an error"
        )


def _grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dq: Any, dk: Any, dv: Any
) -> list[torch.Tensor]:
    """The preallocated dq/dk/dv checked as L850-876 do (or allocated when None)."""
    given = []
    for name, grad, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if grad is None:
            grad = torch.empty_like(like)
        _check(grad.dtype == q.dtype, f"{name} must have the same dtype as q")
        _check(grad.stride(-1) == 1, f"{name} must have contiguous last dimension")
        _shape(name, grad, *like.shape)
        given.append(grad)
    return given


def _backward_checks(dout, q, k, v, out) -> None:
    _dtypes(q, key=k, value=v, out=out, dout=dout)
    _last_dim(q=q, k=k, v=v, out=out, dout=dout)
    _heads(q, k, backward=True)
    for name, t in (("out", out), ("dout", dout)):
        _shape(name, t, *q.shape)
    _shape("v", v, *k.shape)


def bwd(
    dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, alibi_slopes, p_dropout, softmax_scale,
    is_causal, window_size_left, window_size_right, softcap, deterministic, gen, rng_state, /,
) -> list[torch.Tensor]:  # fmt: skip
    """``mha_bwd`` (L767-971): fills dq, dk, dv; [dq, dk, dv, softmax_d]."""
    _unsupported(alibi_slopes=alibi_slopes, p_dropout=p_dropout, softcap=softcap)
    right = 0 if is_causal else window_size_right  # L791
    _backward_checks(dout, q, k, v, out)
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k = k.shape[1]
    _check(batch > 0, "batch size must be positive")
    left = -1 if window_size_left >= seqlen_k else window_size_left  # L840-841
    right = -1 if right >= seqlen_k else right
    grads = _grads(q, k, v, dq_, dk_, dv_)
    _lse(softmax_lse, q, batch, heads, seqlen_q)
    window = _window(left, right, seqlen_k)
    allowed = _allowed(seqlen_q, seqlen_k, window)
    for b in range(batch):
        computed = flash_backward_math(
            dout[b], q[b], k[b], v[b], out[b], softmax_lse[b], allowed, softmax_scale
        )
        for target, grad in zip(grads, computed, strict=True):
            target[b].copy_(grad)
    CALLS.append({"fn": "bwd", "window": window, "lse": softmax_lse})
    delta = (dout.to(_wide(q.dtype)) * out).sum(-1).transpose(1, 2)
    return [*grads, delta.to(torch.float32)]


def varlen_bwd(
    dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
    max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal,
    window_size_left, window_size_right, softcap, deterministic, gen, rng_state, /,
) -> list[torch.Tensor]:  # fmt: skip
    """``mha_varlen_bwd`` (L973-1200): fills dq, dk, dv; [dq, dk, dv, softmax_d]."""
    _unsupported(alibi_slopes=alibi_slopes, p_dropout=p_dropout, softcap=softcap)
    right = 0 if is_causal else window_size_right  # L1002
    _backward_checks(dout, q, k, v, out)
    batch = _cu("cu_seqlens_q", cu_seqlens_q)
    _cu("cu_seqlens_k", cu_seqlens_k, batch)
    _check(batch > 0, "batch size must be positive")
    left = -1 if window_size_left >= max_seqlen_k else window_size_left  # L1055-1056
    right = -1 if right >= max_seqlen_k else right
    grads = _grads(q, k, v, dq_, dk_, dv_)
    _lse(softmax_lse, q, q.shape[1], q.shape[0])
    window = _window(left, right, max_seqlen_k)
    allowed = _segments(cu_seqlens_q, cu_seqlens_k, window)
    computed = flash_backward_math(dout, q, k, v, out, softmax_lse, allowed, softmax_scale)
    for target, grad in zip(grads, computed, strict=True):
        target.copy_(grad)
    CALLS.append({"fn": "varlen_bwd", "window": window, "lse": softmax_lse})
    return [*grads, (dout.to(_wide(q.dtype)) * out).sum(-1).t().to(torch.float32)]
