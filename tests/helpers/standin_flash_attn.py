"""Stand-ins for ``flash_attn`` (2.8) and ``flash_attn_interface`` (FA3 hopper) in plain torch.

Their signatures are the rows of `lcab.kernels.upstream.flash_attn` (`from_row`), held to
flash-attn's own source by ``tests/unit/test_upstream_flash_attn.py``; their semantics are the
libraries' (gpu_kernels.md §1.1, §1.2, §3.1, §3.2, and FA2's ``flash_api.cpp`` window and
swapped-GQA rules), not lcab's lowering, so lcab's adapters can be contract-tested on CPU
(never GPU-verified):

* emulator of the mask: sequence b owns query rows ``cu_q[b]:cu_q[b+1]`` (sq) and key columns
  ``cu_k[b]:cu_k[b+1]`` (sk); local query i sees local key j iff
  ``i + sk - sq - left <= j <= i + sk - sq + right`` (bottom-right aligned diagonal), with
  -1 = unbounded side and ``causal=True`` meaning right = 0; no key of another sequence;
* FA2 first rewrites the window as ``flash_api.cpp`` does (a side ≥ seqlen_k → -1, then an
  unbounded side facing a bounded one → seqlen_k; `fa2_applied_window`), and its varlen call
  takes the swapped GQA path of L592 (LSE (Hq, batch); q reshaped as one query per sequence,
  which fails when a sequence has none);
* softmax attention under that mask, any float dtype (float64 for exact comparisons), GQA by
  query groups (Hq % Hkv == 0), autograd through ``out``; the LSE requires grad as on a GPU
  but its gradient is dropped, as the libraries' backward drops it;
* the private backwards (FA2 ``_flash_attn_backward`` / ``_flash_attn_varlen_backward``, FA3's
  two generations of ``_flash_attn_backward``) fill the preallocated dq/dk/dv from the given
  out and LSE with FlashAttention's backward algorithm (`standin_rows.flash_backward_math`).
  Each is the kind of object its library defines (the row's ``kind``): FA3's newest backward a
  ``torch.library.custom_op`` ``flash_attn_3::_flash_attn_backward`` (0251105a; since
  c7697bbf), its 2025-08 one a plain function (203b9b3d). FA2's backwards here are plain
  functions with the custom ops' parameters; FA2's real Python, custom ops included, is
  exercised over an emulated extension (`tests.helpers.emulated_flash_attn`);
* returns as documented: FA2 ``(out, lse, S_dmask)`` and FA3 ``(out, lse)`` with
  ``return_attn_probs=True``, else ``out``; LSE natural log in (B, H, Sq) for the dense call and
  (H, total_q) for varlen; fully masked rows: out 0 and LSE +inf (FA2) or -inf (FA3). The LSE
  is float32 for 16/32-bit inputs as in the libraries, float64 for float64 inputs (so the
  contract test can be exact).

Every call is appended to ``CALLS`` (which function, its keyword arguments, the raw LSE).
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import math
import types
from typing import Any

import torch

from lcab.kernels.upstream import flash_attn as table
from tests.helpers import real_schemas
from tests.helpers.standin_rows import flash_backward_math, from_row, looks_differentiable

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


def fa2_applied_window(left: int, right: int, causal: bool, seqlen_k: int) -> tuple[int, int]:
    """The window FA2's kernel applies (``flash_api.cpp`` L399-404/L586-609, L141-142)."""
    if causal:
        right = 0
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    if left < 0 <= right:
        left = seqlen_k
    if left >= 0 > right:
        right = seqlen_k
    return left, right


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
    if fn_name == "fa2":
        window_size = fa2_applied_window(*window_size, causal, k.shape[1])
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
    swapped = False
    if fn_name == "fa2":
        left, right = window_size[0], 0 if causal else window_size[1]
        swapped = max_q == 1 and q.shape[1] > k.shape[1] and left < 0 and right < 0
        assert not swapped or q.shape[0] == len(cu_q) - 1, (
            "FA2's swapped GQA path reshapes q as one query per sequence (flash_api.cpp L595)"
        )
        window_size = fa2_applied_window(*window_size, causal, max_k)
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
def _fa2_call(a: dict[str, Any]) -> Any:
    assert a["dropout_p"] == 0.0 and a["softcap"] == 0.0 and a["alibi_slopes"] is None
    q, k, v = a["q"], a["k"], a["v"]
    if "cu_seqlens_q" in a:
        assert a["block_table"] is None
        out, lse = _varlen(
            q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"],
            a["softmax_scale"], a["causal"], a["window_size"], float("inf"), "fa2",
        )  # fmt: skip
    else:
        out, lse = _dense(
            q, k, v, a["softmax_scale"], a["causal"], a["window_size"], float("inf"), "fa2"
        )
    lse = looks_differentiable(lse, q, k, v)
    return (out, lse, torch.empty(0)) if a["return_attn_probs"] else out


fa2_flash_attn_func = from_row(table.FA2_FUNC, _fa2_call)
fa2_flash_attn_varlen_func = from_row(table.FA2_VARLEN_FUNC, _fa2_call)


def fa2_varlen_without_window(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, return_attn_probs=False,
):  # fmt: skip
    """The varlen signature of a flash-attn older than 2.3 (no window_size)."""
    raise AssertionError("the probe must refuse this version before any call")


def _fill(a: dict[str, Any], grads: tuple[torch.Tensor, ...], batched: bool) -> None:
    """Write grads into the preallocated dq, dk, dv (the ops mutate them)."""
    for name, grad in zip(("dq", "dk", "dv"), grads, strict=True):
        target = a[name]
        assert isinstance(target, torch.Tensor) and target.shape[-1] == grad.shape[-1]
        (target[0] if batched else target).copy_(grad)


def _backward_of(a: dict[str, Any], window: tuple[int, int], causal: bool, library: str) -> None:
    """Shared by every private backward: check the inputs as the kernels do, fill dq/dk/dv."""
    q, k, v, out, dout, lse = a["q"], a["k"], a["v"], a["out"], a["dout"], a["softmax_lse"]
    assert q.shape[-1] % 8 == 0, "head_size should be a multiple of 8 (flash_api.cpp L829)"
    assert lse.dtype in (torch.float32, torch.float64) and lse.is_contiguous()
    scale = a["softmax_scale"]
    if a.get("cu_seqlens_q") is not None:
        cu_q, cu_k = a["cu_seqlens_q"], a["cu_seqlens_k"]
        assert lse.shape == (q.shape[1], q.shape[0]), "varlen LSE is (H, total_q)"
        if library == "fa2":
            window = fa2_applied_window(*window, causal, a["max_seqlen_k"])
        allowed = varlen_allowed(cu_q, cu_k, causal, window)
        grads = flash_backward_math(dout, q, k, v, out, lse, allowed, scale)
        _fill(a, grads, batched=False)
        return
    assert q.shape[0] == 1 and lse.shape == (1, q.shape[2], q.shape[1]), "dense LSE is (B, H, Sq)"
    if library == "fa2":
        window = fa2_applied_window(*window, causal, k.shape[1])
    allowed = window_allowed(q.shape[1], k.shape[1], causal, window)
    grads = flash_backward_math(dout[0], q[0], k[0], v[0], out[0], lse[0], allowed, scale)
    _fill(a, grads, batched=True)


def _fa2_backward(a: dict[str, Any]) -> torch.Tensor:
    assert a["dropout_p"] == 0.0 and a["alibi_slopes"] is None and a["softcap"] == 0.0
    window = (a["window_size_left"], a["window_size_right"])
    _backward_of(a, window, a["causal"], "fa2")
    CALLS.append({"fn": "backward", "api": "fa2", "kwargs": dict(a)})
    return torch.empty(0)  # softmax_d, unused by callers


fa2_flash_attn_backward = from_row(table.FA2_BACKWARD, _fa2_backward)
fa2_flash_attn_varlen_backward = from_row(table.FA2_VARLEN_BACKWARD, _fa2_backward)


# ----------------------------------------------------------------------------- FA3 (hopper)
def _fa3_call(a: dict[str, Any]) -> Any:
    assert a["qv"] is None and a["attention_chunk"] == 0 and a["softcap"] == 0.0
    assert a["q"].shape[-1] % 8 == 0, "head_size should be a multiple of 8 (flash_api.cpp L855)"
    q, k, v = a["q"], a["k"], a["v"]
    if "cu_seqlens_q" in a:
        assert a["seqused_q"] is None and a["seqused_k"] is None
        out, lse = _varlen(
            q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"],
            a["softmax_scale"], a["causal"], a["window_size"], float("-inf"), "fa3",
        )  # fmt: skip
    else:
        out, lse = _dense(
            q, k, v, a["softmax_scale"], a["causal"], a["window_size"], float("-inf"), "fa3"
        )
    lse = looks_differentiable(lse, q, k, v)
    return (out, lse) if a["return_attn_probs"] else out


# FA3's functions as the built wheel defines them (tests/unit/data/real_schemas/fa3.json, read
# from the real extension and Python), not as lcab's table reads them
FA3_FUNC = real_schemas.recorded_row("fa3", "flash_attn_interface:flash_attn_func")
FA3_VARLEN_FUNC = real_schemas.recorded_row("fa3", "flash_attn_interface:flash_attn_varlen_func")
FA3_BACKWARD = real_schemas.recorded_row("fa3", "flash_attn_interface:_flash_attn_backward")
fa3_flash_attn_func = from_row(FA3_FUNC, _fa3_call)
fa3_flash_attn_varlen_func = from_row(FA3_VARLEN_FUNC, _fa3_call)


def _fa3_backward(a: dict[str, Any]) -> torch.Tensor:
    assert a["sequed_q"] is None and a["sequed_k"] is None and a["softcap"] == 0.0
    window = (a["window_size_left"], a["window_size_right"])
    _backward_of(a, window, a["is_causal"], "fa3")
    CALLS.append({"fn": "backward", "api": "fa3", "kwargs": dict(a)})
    return torch.empty(0)


def _fa3_backward_aug_2025(a: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    assert a["sequed_q"] is None and a["sequed_k"] is None and a["softcap"] == 0.0
    _backward_of(a, tuple(a["window_size"]), a["causal"], "fa3")
    CALLS.append({"fn": "backward", "api": "fa3-2025-08", "kwargs": dict(a)})
    return a["dq"], a["dk"], a["dv"], torch.empty(0)


def _fa3_backward_op() -> Any:
    """The newest generation as the built library defines it: a ``torch.library.custom_op``
    (``flash_attn_3::_flash_attn_backward``, ``device_types="cuda"``) with the recorded schema
    — its argument types, defaults and mutated arguments — and the recorded parameters, given
    the same function for CPU, as a test does for a library's own op. Its schema is checked
    against the record on creation, so the stand-in cannot drift from the real op."""
    from torch._library import custom_ops

    row = FA3_BACKWARD
    existing = custom_ops.OPDEFS.get(row.op)
    if existing is not None:  # this module imported twice in one process
        return existing
    recorded = real_schemas.load("fa3")["operators"][row.op]["schema"]
    signature = recorded[len(row.op) :]  # "(Tensor dout, ...) -> Tensor"
    body = from_row(row, _fa3_backward)
    op = torch.library.custom_op(
        row.op, body, mutates_args=row.mutates, device_types="cuda", schema=signature
    )
    op.register_kernel("cpu")(op._init_fn)
    assert str(op._opoverload._schema) == recorded, (str(op._opoverload._schema), recorded)
    return op


fa3_flash_attn_backward = _fa3_backward_op()
fa3_flash_attn_backward_aug_2025 = from_row(table.FA3_BACKWARD_AUG_2025, _fa3_backward_aug_2025)
"""The 2025-08 generation (203b9b3d L105-154): a plain function, as upstream had it."""
fa3_flash_attn_backward_function = from_row(
    dataclasses.replace(FA3_BACKWARD, kind="function", op="", mutates=()), _fa3_backward
)
"""The newest parameters as a plain function (what lcab's adapters took before custom ops)."""


def fa3_flash_attn_func_before_july_2025(
    q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
    v_descale=None, window_size=(-1, -1), softcap=0.0, num_splits=1, pack_gqa=None,
    deterministic=False, sm_margin=0,
):  # fmt: skip
    """An FA3 build from before 203b9b3d (2025-08-29): always (out, lse), no return_attn_probs."""
    raise AssertionError("the probe must refuse this build before any call")


# ----------------------------------------------------------------------------- modules
def module(name: str, **functions: Any) -> types.ModuleType:
    """A module object that `importlib.util.find_spec` and `importlib.import_module` accept."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for attr, fn in functions.items():
        setattr(mod, attr, fn)
    return mod


def fa2_modules(**overrides: Any) -> dict[str, types.ModuleType]:
    """Stand-ins ``flash_attn`` (2.8 API) and ``flash_attn.flash_attn_interface``, by name."""
    public = {
        "flash_attn_func": fa2_flash_attn_func,
        "flash_attn_varlen_func": fa2_flash_attn_varlen_func,
    }
    private = {
        "_flash_attn_backward": fa2_flash_attn_backward,
        "_flash_attn_varlen_backward": fa2_flash_attn_varlen_backward,
    }
    interface = module("flash_attn.flash_attn_interface", **(public | private | overrides))
    parent = module("flash_attn", flash_attn_interface=interface, **(public | overrides))
    return {"flash_attn": parent, "flash_attn.flash_attn_interface": interface}


def fa3_modules(**overrides: Any) -> dict[str, types.ModuleType]:
    """Stand-in ``flash_attn_interface`` (FA3 hopper at 0251105a; 203b9b3d by override)."""
    fns = {
        "flash_attn_func": fa3_flash_attn_func,
        "flash_attn_varlen_func": fa3_flash_attn_varlen_func,
        "_flash_attn_backward": fa3_flash_attn_backward,
    }
    return {"flash_attn_interface": module("flash_attn_interface", **(fns | overrides))}


def fa2_module(**overrides: Any) -> types.ModuleType:
    """Stand-in ``flash_attn`` alone (for probes that import only the top module)."""
    return fa2_modules(**overrides)["flash_attn"]


def fa3_module(**overrides: Any) -> types.ModuleType:
    """Stand-in ``flash_attn_interface``."""
    return fa3_modules(**overrides)["flash_attn_interface"]


STANDINS = {"fa2": fa2_modules, "fa3": fa3_modules}
