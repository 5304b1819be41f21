"""MagiAttention's Flex-Flash-Attention (FFA): the forward lcab times and the backward rings call.

Read from ``SandAI-org/MagiAttention`` at tag v1.1.1 (d7ea8afd, 2026-05-21),
``magi_attention/functional/flex_flash_attn.py``:

* ``flex_flash_attn_func`` (L1059-1088) returns ``(out, AttnForwardMeta(lse, max_logits))``
  (L1449); everything after ``attn_type_map`` is keyword-only;
* ``_flex_flash_attn_backward`` (L594-625) — the call MagiAttention's own context-parallel
  runtime makes per stage with the merged out and LSE (``functional/dist_attn.py`` L1421-1450:
  ``dq=dq_acc`` accumulates into the caller's buffer, dk/dv into zeroed fp32 partials,
  ``dq/dk/dv_type`` float32). Given ``dq=None`` it allocates zeros in ``dq_type`` (L635); given
  ``dk=dv=None`` with atomic reduction on (the default), zeros in ``dk/dv_type`` (L643-645).
  It returns ``(dq, dk, dv, dsink)``;
* the LSE is float32 (total_q, Hq), allocated full of -inf (L387-393): rows with no key keep
  -inf. ``FlexFlashAttnFunc.backward(ctx, dout, *args)`` (L913) ignores its gradient: never
  differentiate through it.
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, upstream_function

SOURCE = "SandAI-org/MagiAttention@v1.1.1 (d7ea8afd)"
FILE = "magi_attention/functional/flex_flash_attn.py"

FFA_LSE = LseFact(layout="th", empty_rows="-inf", differentiable=False, dtype="float32")

FFA_FUNC = upstream_function(
    module="magi_attention.functional",
    name="flex_flash_attn_func",
    signature=(
        "q, k, v, q_ranges=None, k_ranges=None, attn_type_map=None, *, index_attn_indices=None, "
        "q_block_size=1, k_block_size=1, sink=None, sink_layout='sh', softmax_scale=None, "
        "softcap=0.0, deterministic=False, sm_margin=0, disable_fwd_atomic_reduction=False, "
        "disable_bwd_dkv_atomic_reduction=False, ref_block_size=None, max_seqlen_q=None, "
        "auto_range_merge=False, swap_ab=False, pack_gqa=False, cat_gqa=False, "
        "sparse_load=False, index_attn=False, swap_bwd_qk_loop=False, return_max_logits=False"
    ),
    returns=("out", "meta"),
    lse=FFA_LSE,
    alignment="causal bottom-right, inv_causal top-left, bi_causal both (kind codes 0-3)",
    source=f"{SOURCE}:{FILE}:L1059-1088",
    notes="the LSE is meta.lse",
)
FFA_BACKWARD = upstream_function(
    module="magi_attention.functional.flex_flash_attn",
    name="_flex_flash_attn_backward",
    signature=(
        "dout, q, k, v, sink, sink_layout, out, lse, dq, dk, dv, dsink, q_ranges, k_ranges, "
        "attn_type_map, softmax_scale, softcap, dq_type, dk_type, dv_type, "
        "disable_bwd_dkv_atomic_reduction, deterministic, sm_margin, auto_range_merge=False, "
        "merge_k_ranges=None, bwd_kq_map=None, bwd_unique_count=None, swap_bwd_qk_loop=False, "
        "pack_gqa=False, cat_gqa=False"
    ),
    returns=("dq", "dk", "dv", "dsink"),
    lse=FFA_LSE,
    alignment="as flex_flash_attn_func",
    source=f"{SOURCE}:{FILE}:L594-625",
    notes="LSE in as the forward returned it, (total_q, Hq); grads in dq/dk/dv_type, reduced "
    "into the dq/dk/dv it is given (zeros in float32 when None); a plain function (nvtx-"
    "instrumented) around the custom op flex_flash_attn::_flex_flash_attn_backward_compilable "
    "(L462-467, mutates dq, dk, dv, dsink)",
    kind="function",
)
