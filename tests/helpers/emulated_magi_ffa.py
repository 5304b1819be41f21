"""FFA's CUDA kernels emulated on the CPU, as CPU kernels of MagiAttention's real operators.

MagiAttention v1.1.1 defines ``flex_flash_attn::_flex_flash_attn_forward_compilable`` and
``_backward_compilable`` in Python (``magi_attention/functional/flex_flash_attn.py``, custom
ops with CUDA and Meta kernels) around the JIT or prebuilt module's ``fwd``/``bwd``; the
forward op fills the ``out_`` and ``lse`` it is given (``mutates_args``), the backward adds
into ``dq``, ``dk``, ``dv``. `tests.helpers.real_wheels.load_ffa` registers these functions as
the ops' CPU kernels, so everything above them — ``flex_flash_attn_func``, its autograd
function, the buffers it allocates (out in float32 under atomic reduction, LSE in float32,
(total_q, Hq), -inf where nothing is attended), the range checks — is the built library's own.

The semantics are FFA's, as the stand-in documents them (`tests.helpers.standin_magi_ffa`):
slice s covers query rows ``q_ranges[s]`` and key columns ``k_ranges[s]`` under
``attn_type_map[s]`` (0 full, 1 causal bottom-right, 2 inverse causal, 3 both), and a pair two
slices cover is reduced twice. Only what lcab calls is emulated: no sink, softcap, index or
sparse-load attention, max logits or range merging (each refused by name).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.helpers.standin_magi_ffa import coverage
from tests.helpers.standin_rows import flash_backward_math

CALLS: list[dict[str, Any]] = []
"""Each emulated kernel call: ``{"op": "fwd" | "bwd", ...}`` (tests read it)."""


def _refuse(**unsupported: Any) -> None:
    used = [name for name, value in unsupported.items() if value]
    if used:
        raise NotImplementedError(f"the CPU emulation of FFA does not do {', '.join(used)}")


def _count(q_ranges, k_ranges, attn_type_map, sq: int, sk: int) -> torch.Tensor:
    kinds = (
        attn_type_map
        if attn_type_map is not None
        else torch.zeros(len(q_ranges), dtype=torch.int32)
    )
    return coverage(q_ranges.cpu(), k_ranges.cpu(), kinds.cpu(), sq, sk)


def fwd(q, k, v, sink, sink_layout, out_, lse, q_ranges, k_ranges, attn_type_map,
        softmax_scale, softcap, out_type, disable_fwd_atomic_reduction, deterministic,
        sm_margin, kblock_m, kblock_n, max_seqlen_q, auto_range_merge, merge_q_ranges,
        fwd_qk_map, fwd_unique_count, swap_ab, pack_gqa, sparse_load, sparse_load_loop_count,
        sparse_load_invalid_count, equal_k_range_size, index_attn, index_attn_indices_2d,
        index_attn_max_topk, return_max_logits, max_logits) -> None:  # fmt: skip
    """``_flex_flash_attn_forward_compilable`` on the CPU: fills ``out_`` and ``lse``."""
    _refuse(sink=sink is not None, softcap=softcap > 0.0, index_attn=index_attn,
            sparse_load=sparse_load, return_max_logits=return_max_logits,
            auto_range_merge=auto_range_merge)  # fmt: skip
    count = _count(q_ranges, k_ranges, attn_type_map, q.shape[0], k.shape[0])
    group = q.shape[1] // k.shape[1]
    wide = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(wide)
    kk, vv = (t.to(wide).repeat_interleave(group, 1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", qf, kk) * softmax_scale
    empty = count.sum(-1) == 0
    weight = torch.where(empty[:, None], 1.0, count.to(wide))  # pairs covered n times: n terms
    scores = torch.where(count[None] > 0, scores + torch.log(weight), float("-inf"))
    row_lse = torch.logsumexp(scores.masked_fill(empty[None, :, None], 0.0), -1)
    probs = torch.exp(scores - row_lse[..., None]).masked_fill(empty[None, :, None], 0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    row_lse = row_lse.masked_fill(empty[None], float("-inf"))
    out_.copy_(out.to(out_.dtype))
    lse.copy_(row_lse.t().to(lse.dtype))
    CALLS.append({"op": "fwd", "out_dtype": out_.dtype, "lse_dtype": lse.dtype})


def bwd(dout, q, k, v, sink, sink_layout, out_, lse, dq, dk, dv, dsink, q_ranges, k_ranges,
        attn_type_map, softmax_scale, softcap, dq_type, dk_type, dv_type,
        disable_bwd_dkv_atomic_reduction, deterministic, sm_margin, auto_range_merge,
        merge_k_ranges, bwd_kq_map, bwd_unique_count, swap_bwd_qk_loop, pack_gqa,
        cat_gqa) -> None:  # fmt: skip
    """``_flex_flash_attn_backward_compilable`` on the CPU: adds into ``dq``, ``dk``, ``dv``."""
    _refuse(sink=sink is not None, softcap=softcap > 0.0, auto_range_merge=auto_range_merge,
            cat_gqa=cat_gqa)  # fmt: skip
    count = _count(q_ranges, k_ranges, attn_type_map, q.shape[0], k.shape[0])
    grads = flash_backward_math(dout, q, k, v, out_, lse.t(), count, softmax_scale)
    for target, grad in zip((dq, dk, dv), grads, strict=True):
        if disable_bwd_dkv_atomic_reduction and target is not dq:
            target.copy_(grad.to(target.dtype))
        else:
            target.add_(grad.to(target.dtype))  # FFA reduces into the buffers it is given
    CALLS.append({"op": "bwd", "dq_dtype": dq.dtype})
