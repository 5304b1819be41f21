"""flashinfer-python's block-sparse wrappers, read in the 0.7.2.post1 wheel from PyPI.

The wheel holds the repository's ``flashinfer/sparse.py`` as is (flashinfer-ai/flashinfer).
Rows follow ``inspect.signature`` of the attribute: a class row lists its constructor's
parameters without ``self``, a method row (``Class.method``) with it. ``run`` is wrapped by
``flashinfer_api``, which keeps the signature (``functools.wraps``, ``api_logging.py``).

Facts beyond the signatures, same file: the BSR wrapper's ``run`` allocates the LSE float32
(M, num_qo_heads) (L1559-1567), the variable wrapper's comes back (num_qo_heads, qo_len)
(L2229-2234); both return ``(out, lse)`` when ``return_lse=True``, else ``out`` (L1645,
L2236). The LSE is in **log2** units: the kernels scale scores by log2 e and the FA2 kernel
writes ``ptx_log2(d) + m`` (``data/include/flashinfer/attention/prefill.cuh`` L3410-3411);
``prefill.py``'s wrappers take ``lse_base="log2"`` by default, the sparse ones have no such
option. The value on rows attending nothing is not documented. FlashInfer has no autograd.
The causal flag of the BSR plan is bottom-right aligned per row block over its gathered keys.
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, upstream_function

DISTRIBUTION = "flashinfer-python"
VERSION = "0.7.2.post1"
MODULE = "flashinfer"
_FILE = f"flashinfer-ai/flashinfer@{VERSION}:flashinfer/sparse.py"

BSR = "BlockSparseAttentionWrapper"
VARIABLE = "VariableBlockSparseAttentionWrapper"
_NOT_DIFFERENTIABLE = "no autograd (forward only)"

BSR_INIT = upstream_function(
    module=MODULE,
    name=BSR,
    signature="float_workspace_buffer, backend='auto'",
    source=f"{_FILE}:L409-413",
)

BSR_PLAN = upstream_function(
    module=MODULE,
    name=f"{BSR}.plan",
    signature=(
        "self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None, "
        "packed_mask=None, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, "
        "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, "
        "q_data_type='float16', kv_data_type=None, o_data_type='float16', non_blocking=True, "
        "block_mask=None, kv_block_lens=None, q2k_indices=None, q2k_num=None, kv_splits=None, "
        "use_clc=None, q_scale=None, k_scale=None, v_scale=None"
    ),
    alignment="causal: bottom-right within each row block's gathered keys",
    source=f"{_FILE}:L503-538",
    notes="mask: (nnz, R, C) bool element mask; N must be divisible by C",
)

BSR_RUN = upstream_function(
    module=MODULE,
    name=f"{BSR}.run",
    signature=(
        "self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None, "
        "return_lse=False, enable_pdl=None"
    ),
    returns=("out", "lse"),
    lse=LseFact("th", base="2"),
    source=f"{_FILE}:L1351-1362",
    notes=f"q (M, Hq, D), k/v (N, Hkv, D); lse (M, Hq); {_NOT_DIFFERENTIABLE}",
)

VARIABLE_INIT = upstream_function(
    module=MODULE,
    name=VARIABLE,
    signature="float_workspace_buffer, backend='auto'",
    source=f"{_FILE}:L1682-1686",
)

VARIABLE_PLAN = upstream_function(
    module=MODULE,
    name=f"{VARIABLE}.plan",
    signature=(
        "self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads, head_dim, "
        "causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, "
        "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, "
        "non_blocking=True, q_data_type='float16', kv_data_type=None"
    ),
    source=f"{_FILE}:L1771-1789",
    notes="block_mask_map (Hkv, MB, NB) bool; block_row_sz (Hkv, MB), block_col_sz (Hkv, NB)",
)

VARIABLE_RUN = upstream_function(
    module=MODULE,
    name=f"{VARIABLE}.run",
    signature="self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None",
    returns=("out", "lse"),
    lse=LseFact("ht", base="2"),
    source=f"{_FILE}:L2081-2090",
    notes=f"q (Hq, S, D), k/v (Hkv, S, D); lse (Hq, S); {_NOT_DIFFERENTIABLE}",
)

ROWS = (BSR_INIT, BSR_PLAN, BSR_RUN, VARIABLE_INIT, VARIABLE_PLAN, VARIABLE_RUN)
