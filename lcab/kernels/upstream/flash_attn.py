"""FlashAttention 2 (``flash_attn``) and 3 (``flash_attn_interface``): the functions lcab calls.

Read from the sources named in each row's ``source``:

* FA2 — ``flash_attn/flash_attn_interface.py`` and ``csrc/flash_attn/flash_api.cpp`` of the
  flash-attn 2.8.3.post2 sdist on PyPI. The private calls are ``torch.library.custom_op``s
  (``flash_attn::...``) whenever ``torch.__version__ >= "2.4.0"`` (L54-58);
* FA3 — ``hopper/flash_attn_interface.py`` at two commits: 0251105a (HEAD of 2026-08-15; the
  file last changed in 0f82fead), whose private backward — a ``torch.library.custom_op``
  ``flash_attn_3::_flash_attn_backward`` since c7697bbf (2025-11-17) — takes
  ``window_size_left/right`` and ``is_causal`` and fills dq/dk/dv in place, and 203b9b3d
  (2025-08-29, the first build that returns the LSE by keyword), whose backward — a plain
  function — takes ``window_size`` and returns ``(dq, dk, dv, softmax_d)``. An adapter tells
  them apart by the parameters of the installed object (a custom op's are its function's).

Facts beyond the signatures, with their lines:

* LSE: natural log, float32, (B, H, Sq) from the dense call and (H, total_q) from varlen (FA2
  ``flash_api.cpp`` mha_fwd / mha_varlen_fwd); rows with no key get +inf from FA2
  (``softmax.h`` L180: ``sum == 0`` → INFINITY) and -inf from FA3. Neither backward uses the
  LSE's gradient (FA2 ``FlashAttnFunc.backward(ctx, dout, *args)``; FA3 ``_backward(ctx, dout,
  *grads)``), although autograd marks the LSE as requiring grad: never differentiate through it.
* The backward kernels read an LSE of -inf as 0 (FA2 ``softmax.h`` L76 ``max == -INFINITY ? 0``;
  FA3 ``flash_bwd_preprocess_kernel.h`` L228) and +inf gives probabilities 0 (FA2
  ``flash_bwd_kernel.h`` L413-416 uses +inf for rows out of range for that reason).
* Head dims: FA2's public calls pad to a multiple of 8, its private backward does not and checks
  ``head_size % 8 == 0`` (``flash_api.cpp`` L829, L1045); FA3 checks the same in the forward and
  never pads (hopper ``flash_api.cpp`` L854-855).
* Windows, bottom-right aligned, -1 = unbounded. FA2 (``flash_api.cpp`` L399-400, L608-609 and
  ``set_params_fprop`` L141-142): a side ≥ seqlen_k (max_seqlen_k for varlen) becomes -1, then an
  unbounded side facing a bounded one becomes seqlen_k. FA3 (hopper ``flash_api.cpp`` L576-577,
  L589-590): left ≥ max_seqlen_k - 1 and right ≥ max_seqlen_q - 1 become -1, and -1 becomes those
  same bounds, which never bind.
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, upstream_function

FA2_SOURCE = "Dao-AILab/flash-attention@v2.8.3 (PyPI flash-attn 2.8.3.post2 sdist)"
FA3_HEAD = "Dao-AILab/flash-attention@0251105a (2026-08-15)"
FA3_AUG_2025 = "Dao-AILab/flash-attention@203b9b3d (2025-08-29)"
FA2_FILE = "flash_attn/flash_attn_interface.py"
FA3_FILE = "hopper/flash_attn_interface.py"

FA2_LSE = LseFact(
    layout="bhs", varlen_layout="ht", empty_rows="+inf", differentiable=False, dtype="float32"
)
FA3_LSE = LseFact(
    layout="bhs", varlen_layout="ht", empty_rows="-inf", differentiable=False, dtype="float32"
)

VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")

FA2_FUNC = upstream_function(
    module="flash_attn",
    name="flash_attn_func",
    signature=(
        "q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
        "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False"
    ),
    returns=("out", "softmax_lse", "S_dmask"),
    lse=FA2_LSE,
    alignment="bottom-right",
    source=f"{FA2_SOURCE}:{FA2_FILE}:L1135-1147",
    notes="returns out alone unless return_attn_probs; (out, lse, S_dmask) with it",
)
FA2_VARLEN_FUNC = upstream_function(
    module="flash_attn",
    name="flash_attn_varlen_func",
    signature=(
        "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, "
        "softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, "
        "deterministic=False, return_attn_probs=False, block_table=None"
    ),
    returns=("out", "softmax_lse", "S_dmask"),
    lse=FA2_LSE,
    alignment="bottom-right",
    source=f"{FA2_SOURCE}:{FA2_FILE}:L1370-1387",
)
FA2_BACKWARD = upstream_function(
    module="flash_attn.flash_attn_interface",
    name="_flash_attn_backward",
    signature=(
        "dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, "
        "window_size_left, window_size_right, softcap, alibi_slopes, deterministic, "
        "rng_state=None"
    ),
    returns=("softmax_d",),
    lse=FA2_LSE,
    alignment="bottom-right",
    source=f"{FA2_SOURCE}:{FA2_FILE}:L237-286",
    notes="custom op mutating dq, dk, dv (preallocated, q's dtype, head dim a multiple of 8); "
    "the LSE goes in as the forward returned it, (B, H, Sq)",
    kind="custom_op",
    op="flash_attn::_flash_attn_backward",
    mutates=("dq", "dk", "dv"),
)
FA2_VARLEN_BACKWARD = upstream_function(
    module="flash_attn.flash_attn_interface",
    name="_flash_attn_varlen_backward",
    signature=(
        "dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, "
        "max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right, "
        "softcap, alibi_slopes, deterministic, rng_state=None, zero_tensors=False"
    ),
    returns=("softmax_d",),
    lse=FA2_LSE,
    alignment="bottom-right",
    source=f"{FA2_SOURCE}:{FA2_FILE}:L329-390",
    notes="custom op mutating dq, dk, dv; LSE (H, total_q)",
    kind="custom_op",
    op="flash_attn::_flash_attn_varlen_backward",
    mutates=("dq", "dk", "dv"),
)

FA3_FUNC = upstream_function(
    module="flash_attn_interface",
    name="flash_attn_func",
    signature=(
        "q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, "
        "v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, "
        "pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False"
    ),
    returns=("out", "softmax_lse"),
    lse=FA3_LSE,
    alignment="bottom-right",
    source=f"{FA3_HEAD}:{FA3_FILE}:L809-825 (same at 203b9b3d L507-523)",
    notes="returns out alone unless return_attn_probs (from 203b9b3d on)",
)
FA3_VARLEN_FUNC = upstream_function(
    module="flash_attn_interface",
    name="flash_attn_varlen_func",
    signature=(
        "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, "
        "seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, "
        "k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, "
        "num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False"
    ),
    returns=("out", "softmax_lse"),
    lse=FA3_LSE,
    alignment="bottom-right",
    source=f"{FA3_HEAD}:{FA3_FILE}:L890-912 (same at 203b9b3d L588-610)",
)
FA3_BACKWARD = upstream_function(
    module="flash_attn_interface",
    name="_flash_attn_backward",
    signature=(
        "dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None, sequed_q=None, "
        "sequed_k=None, max_seqlen_q=None, max_seqlen_k=None, dq=None, dk=None, dv=None, "
        "softmax_scale=None, is_causal=False, window_size_left=-1, window_size_right=-1, "
        "softcap=0.0, deterministic=False, sm_margin=0"
    ),
    returns=("softmax_d",),
    lse=FA3_LSE,
    alignment="bottom-right",
    source=f"{FA3_HEAD}:{FA3_FILE}:L258-310",
    notes="custom op mutating dq, dk, dv (the 'sequed' spelling is upstream's); a custom op "
    "since c7697bbf (2025-11-17, namespace flash_attn until fde4bc0c the same day), called "
    "positionally by the library's _backward (L422-446)",
    kind="custom_op",
    op="flash_attn_3::_flash_attn_backward",
    mutates=("dq", "dk", "dv"),
)
FA3_BACKWARD_AUG_2025 = upstream_function(
    module="flash_attn_interface",
    name="_flash_attn_backward",
    signature=(
        "dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, sequed_q, sequed_k, "
        "max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale, causal, window_size=(-1, -1), "
        "softcap=0.0, deterministic=False, sm_margin=0"
    ),
    returns=("dq", "dk", "dv", "softmax_d"),
    lse=FA3_LSE,
    alignment="bottom-right",
    source=f"{FA3_AUG_2025}:{FA3_FILE}:L105-154",
    notes="a plain function: fills the dq, dk, dv it is given and returns them",
    kind="function",
)

FA2_ROWS = (FA2_FUNC, FA2_VARLEN_FUNC, FA2_BACKWARD, FA2_VARLEN_BACKWARD)
