"""mit-han-lab Block-Sparse-Attention (``block_sparse_attn``), read at commit 49d6c39 (v0.0.2).

Read in ``block_sparse_attn/block_sparse_attn_interface.py``. Facts beyond the signature:
the wrapper hard-codes 128x128 blocks (L474), renumbers the ones of ``head_mask_type`` into a
running count and asserts ``base_blockmask.shape[1]`` equals it (L465-467);
``BlockSparseAttnFunc.forward`` returns ``out``, or ``(out, softmax_lse, S_dmask)`` when
``return_attn_probs=True`` (L404). The LSE is FA2's: natural log, float32,
(batch, Hq, max_seqlen_q), +inf on rows attending nothing, and its gradient is not used by the
backward (``ctx`` keeps it; ``backward(ctx, dout, *args)``).
"""

from __future__ import annotations

from lcab.kernels.upstream.facts import LseFact, upstream_function

VERSION = "49d6c39"
MODULE = "block_sparse_attn"
_FILE = (
    f"mit-han-lab/Block-Sparse-Attention@{VERSION}:block_sparse_attn/block_sparse_attn_interface.py"
)

BLOCK_SPARSE_ATTN_FUNC = upstream_function(
    module=MODULE,
    name="block_sparse_attn_func",
    signature=(
        "q, k, v, cu_seqlens_q, cu_seqlens_k, head_mask_type, streaming_info, base_blockmask, "
        "max_seqlen_q_, max_seqlen_k_, p_dropout, deterministic=False, softmax_scale=None, "
        "is_causal=False, exact_streaming=False, return_attn_probs=False"
    ),
    returns=("out", "softmax_lse", "S_dmask"),
    lse=LseFact("bhs", empty_rows="+inf"),
    alignment="n/a: whole 128x128 blocks (is_causal=False)",
    source=f"{_FILE}:L451-464",
    notes="varlen q/k/v (total, H, D); lse (batch, Hq, max_seqlen_q)",
)

ROWS = (BLOCK_SPARSE_ATTN_FUNC,)
