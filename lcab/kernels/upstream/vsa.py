"""fastvideo-kernel's VSA ops (``fastvideo_kernel.block_sparse_attn``), read in the 0.3.5 sdist.

Read in the sdist's ``python/fastvideo_kernel/block_sparse_attn.py`` (hao-ai-lab/FastVideo's
``fastvideo-kernel/``). Both are ``torch.library.custom_op`` functions, CUDA only, returning
``(o, lse)``.

Facts beyond the signatures: the Triton op's LSE ``M`` is (B, H, S) float32 (its fake kernel,
L161-179) holding ``m_i + log2(l_i)`` on scores scaled by scale·log2 e
(``triton_kernels/block_sparse_attn_triton.py`` L163-165): log2 units. The ThunderKittens
op's is (B, H, S, 1) float32 (fake kernel L283-301) holding ``(max·scale + ln sum)·(-sqrt(D))``
(``csrc/attention/block_sparse_h100.cu`` L252-257: ``-8`` for D = 64, ``-11.3137`` for
D = 128): natural log times `TK_LSE_FACTOR`. Neither backward uses the LSE's gradient
(``_backward_triton(ctx, grad_o, grad_M)`` L241-245, ``_backward_sm90`` L364-368 drop it).
"""

from __future__ import annotations

import math

from lcab.kernels.upstream.facts import LseFact, upstream_function

DISTRIBUTION = "fastvideo-kernel"
VERSION = "0.3.5"
MODULE = "fastvideo_kernel.block_sparse_attn"
_FILE = (
    f"hao-ai-lab/FastVideo@fastvideo-kernel-{VERSION}:"
    "fastvideo-kernel/python/fastvideo_kernel/block_sparse_attn.py"
)
_NOTES = "q/k/v (1, H, S, D) bf16, S % 64 == 0; q2k_idx (1, H, nQb, max_kv) int32"

BLOCK_SPARSE_ATTN_TRITON = upstream_function(
    module=MODULE,
    name="block_sparse_attn_triton",
    signature="q, k, v, q2k_idx, q2k_num, variable_block_sizes",
    returns=("o", "M"),
    lse=LseFact("bhs", base="2"),
    alignment="n/a: whole 64x64 blocks",
    source=f"{_FILE}:L138-145",
    notes=_NOTES,
)

BLOCK_SPARSE_ATTN_SM90 = upstream_function(
    module=MODULE,
    name="block_sparse_attn_sm90",
    signature="q_padded, k_padded, v_padded, q2k_idx, q2k_num, variable_block_sizes",
    returns=("o_padded", "lse_padded"),
    lse=LseFact("bhs1", empty_rows="undefined: the kernel reads entry q2k_num - 1"),
    alignment="n/a: whole 64x64 blocks",
    source=f"{_FILE}:L259-266",
    notes=f"{_NOTES}; ThunderKittens, sm_90a, head dim 64 or 128",
)

ROWS = (BLOCK_SPARSE_ATTN_TRITON, BLOCK_SPARSE_ATTN_SM90)


def tk_lse_factor(head_dim: int) -> float:
    """What the ThunderKittens op multiplies its natural-log LSE by: ``-sqrt(head_dim)``."""
    return -math.sqrt(head_dim)
