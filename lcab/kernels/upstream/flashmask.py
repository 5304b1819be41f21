"""FlashMask V3, torch build (PaddlePaddle/flash-attention): the functions lcab calls.

Read at PaddlePaddle/flash-attention 9985af53 (``main``, 2026-08-17), directory
``flashmask/flash_mask/flashmask_attention_v3/`` (``FM3`` below); every row's ``source`` names
the file and lines.

Facts beyond the signatures, with their lines:

* The documented torch build installs the module **``interface_torch``** (``setup_torch.py``
  L819 ``py_modules=["interface_torch"]``), distribution ``flashmask`` 3.0.0b1 (L60, L741-742),
  extension ``flashmask._C`` (L728-729), which ``interface_torch`` imports (L27) and reaches as
  ``flashmask_cuda = torch.ops.flashmask`` (L31). ``flashmask_interface`` exists only in the
  unmerged PR #98.
* ``startend_row_indices`` (B, H_mask, Sk, C) int32 with H_mask in {1, Hq, Hkv} (L816-822),
  C in {1, 2} when causal and {2, 4} otherwise (L848-866). The kernel applies its values as
  **absolute row intervals** of the whole score matrix, not per triangle
  (``mainloop_fwd_sm90_tma_gmma_ws.hpp`` L1472-1545, ``flash_mask.hpp`` L50-81 for the
  backward): row i of key column j is masked when LTS <= i < LTE or UTS <= i < UTE (C=4);
  i >= LTS or i < UTE (non-causal C=2); LTS <= i < LTE (causal C=2); i >= LTS (causal C=1).
  ``causal`` adds FA3's causal mask, bottom-right aligned (``mask.h`` L99-111: column j is
  masked for row i when j > i + Sk - Sq). Nothing requires Sq == Sk (the Python checks only
  ``shape[2] == Sk``, L813-815).
* The LSE comes back as (B, Hq, Sq) float32, natural log (``flash_api_torch.cpp`` L601-607);
  -inf on a row with no key (``softmax.h`` L165). ``FlashMaskFunc.backward(ctx, dout, dlse)``
  never reads ``dlse`` (``interface_torch.py`` L65-100): the LSE is not differentiable.
* The backward op ``bwd`` takes ``out`` and ``softmax_lse`` as given — the merged statistics of
  a ring step work — and returns (dq, dk, dv); it reads an LSE of -inf as 0
  (``flash_bwd_preprocess_kernel.h`` L242), where every score of the row is masked anyway.
* Head dim a multiple of 8 and at most 256, fp16/bf16, sm90 only (``flash_api_torch.cpp``
  L367-377, L453-461, L559-563, L1224-1228). ``FLAGS_flash_attn_version`` defaults to "3"
  (``interface_torch.py`` L869); with ``FLAGS_cudnn_deterministic=1`` and head dim > 128 the
  call takes the version-2 path, which raises NotImplementedError (L870-894).
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, UpstreamFunction, upstream_function

COMMIT = "PaddlePaddle/flash-attention@9985af538d20bd7a56c7a5f5ea13294d454a011a (2026-08-17)"
FM3 = "flashmask/flash_mask/flashmask_attention_v3"
MODULE = "interface_torch"
"""The module the documented torch build installs (``setup_torch.py`` L819)."""
DISTRIBUTION = "flashmask"
VERSION = "3.0.0b1"

FLASHMASK_LSE = LseFact(layout="bhs", empty_rows="-inf", differentiable=False, dtype="float32")

FLASHMASK_ATTENTION = upstream_function(
    module=MODULE,
    name="flashmask_attention",
    signature=(
        "query, key, value, startend_row_indices=None, *, dropout=0.0, causal=False, "
        "window_size=None, return_softmax_lse=False, return_seed_offset=False, "
        "fixed_seed_offset=None, rng_name='', training=True, name=None, softmax_scale=None, "
        "block_mask=None"
    ),
    returns=("out", "softmax_lse"),
    lse=FLASHMASK_LSE,
    alignment="startend_row_indices: absolute rows; causal: bottom-right",
    source=f"{COMMIT}:{FM3}/interface_torch.py:L105-952",
    notes="q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D); returns out alone unless "
    "return_softmax_lse (then [out, lse]); softmax_scale None = D**-0.5",
)

FLASHMASK_FWD = upstream_function(
    module=MODULE,
    name="flashmask_cuda.fwd",
    signature=(
        "q, k, v, k_new=None, v_new=None, q_v=None, out=None, cu_seqlens_q=None, "
        "cu_seqlens_k=None, cu_seqlens_k_new=None, seqused_q=None, seqused_k=None, "
        "max_seqlen_q=0, max_seqlen_k=0, page_table=None, kv_batch_idx=None, leftpad_k=None, "
        "rotary_cos=None, rotary_sin=None, q_descale=None, k_descale=None, v_descale=None, "
        "softmax_scale=0.0, is_causal=False, window_size_left=-1, window_size_right=-1, "
        "softcap=0.0, startend_row_indices=None, block_mask=None, is_rotary_interleaved=True, "
        "scheduler_metadata=None, num_splits=1, pack_gqa=False, sm_margin=0"
    ),
    returns=("out", "softmax_lse"),
    lse=FLASHMASK_LSE,
    alignment="startend_row_indices: absolute rows; causal: bottom-right",
    source=f"{COMMIT}:{FM3}/flash_api_torch.cpp:L1652-1688",
    notes="torch.ops.flashmask.fwd, the op FlashMaskFunc.forward calls by keyword",
    kind="library_op",
    op="flashmask::fwd",
    mutates=("k_new", "v_new", "out"),
)
FLASHMASK_BWD = upstream_function(
    module=MODULE,
    name="flashmask_cuda.bwd",
    signature=(
        "dout, q, k, v, out, softmax_lse, dq=None, dk=None, dv=None, cu_seqlens_q=None, "
        "cu_seqlens_k=None, seqused_q=None, seqused_k=None, startend_row_indices=None, "
        "block_mask=None, max_seqlen_q=None, max_seqlen_k=None, softmax_scale=0.0, "
        "is_causal=False, window_size_left=-1, window_size_right=-1, softcap=0.0, "
        "deterministic=False, sm_margin=0"
    ),
    returns=("dq", "dk", "dv"),
    lse=FLASHMASK_LSE,
    alignment="startend_row_indices: absolute rows; causal: bottom-right",
    source=f"{COMMIT}:{FM3}/flash_api_torch.cpp:L1689-1714",
    notes="torch.ops.flashmask.bwd: dq/dk/dv in q's dtype, (B, S, H, D); dk/dv summed over the "
    "query heads of a KV head; the LSE goes in as the forward returned it, (B, Hq, Sq) float32",
    kind="library_op",
    op="flashmask::bwd",
)

ROWS: tuple[UpstreamFunction, ...] = (FLASHMASK_ATTENTION, FLASHMASK_FWD, FLASHMASK_BWD)
"""Every row of this table."""
