"""cuDNN fused attention as lcab calls it: TransformerEngine's ``DotProductAttention``.

Read in the ``transformer-engine`` 2.20.2 wheel from PyPI (the pure-Python part; the same file
as NVIDIA/TransformerEngine's ``transformer_engine/pytorch/attention/dot_product_attention/
dot_product_attention.py``). The class is exported by ``transformer_engine.pytorch``. A class
row lists the constructor's parameters without ``self`` (``inspect.signature`` of the class),
the method row with it.

Facts beyond the signatures, same file: ``bottom_right_diagonal=None`` means top-left for
``attn_mask_type`` "causal"/"padding_causal" and bottom-right for the others (L755-759), so
TE's causal and window alignment for unequal query/key lengths depends on the mask type;
``forward`` returns the attention output only — (T, H·D) for ``qkv_format="thd"`` — and no
softmax statistics (they come out of the private ``fused_attn_fwd`` alone). The backend
switches ``NVTE_FUSED_ATTN``/``NVTE_FLASH_ATTN``/``NVTE_UNFUSED_ATTN`` are read per call.
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import upstream_function

DISTRIBUTION = "transformer-engine"
VERSION = "2.20.2"
MODULE = "transformer_engine.pytorch"
_FILE = (
    f"NVIDIA/TransformerEngine@{VERSION}:"
    "transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py"
)
_ALIGNMENT = (
    "bottom_right_diagonal=None: top-left for causal/padding_causal, bottom-right otherwise"
)

DOT_PRODUCT_ATTENTION = upstream_function(
    module=MODULE,
    name="DotProductAttention",
    signature=(
        "num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0, "
        "qkv_format='sbhd', attn_mask_type='causal', window_size=None, "
        "bottom_right_diagonal=None, softcap=0.0, sequence_parallel=False, tp_size=1, "
        "get_rng_state_tracker=None, tp_group=None, layer_number=None, attention_type='self', "
        "cp_group=None, cp_global_ranks=None, cp_stream=None, cp_comm_type='p2p', "
        "softmax_scale=None, softmax_type='vanilla', return_max_logit=False, name=None"
    ),
    alignment=_ALIGNMENT,
    source=f"{_FILE}:L854-879",
)

DOT_PRODUCT_ATTENTION_FORWARD = upstream_function(
    module=MODULE,
    name="DotProductAttention.forward",
    signature=(
        "self, query_layer=None, key_layer=None, value_layer=None, attention_mask=None, "
        "qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None, "
        "cu_seqlens_kv_padded=None, max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None, "
        "window_size=None, bottom_right_diagonal=None, softcap=None, "
        "checkpoint_core_attention=False, core_attention_bias_type='no_bias', "
        "core_attention_bias=None, alibi_slopes=None, fast_zero_fill=True, "
        "inference_params=None, pad_between_seqs=None, fp8_output=False, bf16_backward=False, "
        "num_splits=1, score_mod=None, score_mod_bprop=None, score_mod_tensors=None, "
        "score_mod_bprop_tensors=None, qkv_layer=None, kv_layer=None, qkv_interleave_dim=-3, "
        "thd_attention_policies=None, thd_attention_policy_dispatch='auto'"
    ),
    returns=("out",),
    alignment=_ALIGNMENT,
    source=f"{_FILE}:L1935-1972",
    notes="thd: q (T, Hq, D), k/v (T, Hkv, D) -> out (T, Hq*D); no LSE",
)

ROWS = (DOT_PRODUCT_ATTENTION, DOT_PRODUCT_ATTENTION_FORWARD)
