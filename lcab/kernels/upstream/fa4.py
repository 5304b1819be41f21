"""flash-attn-4 (``flash_attn.cute``), read in the 4.0.0b36 wheel from PyPI.

The wheel holds the repository's ``flash_attn/cute`` as is, so the paths below are both the
file in Dao-AILab/flash-attention and the installed file. Facts beyond the signatures, read in
the same file: ``_resolve_causal_local_window`` (L438-459) takes ``None`` as an unbounded side
and a pair of two negative ints as "no window" (so (-1, 5) is a window, not a causal band),
``causal=True`` sets the right side to 0, and the diagonal is bottom-right aligned; the LSE is
allocated float32 (B, H, Sq) dense and (H, total_q) varlen (L866-867; heads-last only with
``qv``), filled with -inf on empty problems (L899-901), and computed in base 2 then multiplied
by ln 2 (``softmax.py`` L277-286: natural log, -inf on rows whose sum is 0); both autograd
functions return ``(out, lse)`` (L3854) — ``lse`` is None unless ``return_lse=True`` or a
gradient is needed — and their backward passes ``dlse`` on when ``return_lse=True``
(L3857-3861): the LSE is differentiable.
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, upstream_function

DISTRIBUTION = "flash-attn-4"
VERSION = "4.0.0b36"
MODULE = "flash_attn.cute"
_FILE = f"Dao-AILab/flash-attention@{VERSION}:flash_attn/cute/interface.py"

#: The dense LSE: natural log, float32, -inf on empty rows, its gradient reaches the backward.
LSE = LseFact("bhs", empty_rows="-inf", differentiable=True)
_ALIGNMENT = "bottom-right; None = unbounded side; two negative ints = no window"

FLASH_ATTN_FUNC = upstream_function(
    module=MODULE,
    name="flash_attn_func",
    signature=(
        "q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False, "
        "window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, "
        "pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, "
        "aux_tensors=None, aux_scalars=None, block_sparse_tensors=None, "
        "block_sparse_tensors_bwd=None, return_lse=False, gather_bwd_recompute_p=False, "
        "gather_bwd_token_chunk=None"
    ),
    returns=("out", "lse"),
    lse=LSE,
    alignment=_ALIGNMENT,
    source=f"{_FILE}:L4145-4169",
    notes="q/k/v (B, S, H, D); lse (B, H, Sq)",
)

FLASH_ATTN_VARLEN_FUNC = upstream_function(
    module=MODULE,
    name="flash_attn_varlen_func",
    signature=(
        "q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, "
        "max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None, "
        "gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False, "
        "window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, "
        "pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, "
        "block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False, "
        "scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False, "
        "gather_bwd_recompute_p=False, gather_bwd_token_chunk=None"
    ),
    returns=("out", "lse"),
    lse=LseFact("ht", empty_rows="-inf", differentiable=True),
    alignment=_ALIGNMENT,
    source=f"{_FILE}:L4214-4248",
    notes="q/k/v (total, H, D), int32 cu_seqlens; lse (H, total_q)",
)

ROWS = (FLASH_ATTN_FUNC, FLASH_ATTN_VARLEN_FUNC)
