"""Attention kernels behind one contract (`lcab.kernels.base`), registered by name.

Public API::

    from lcab.kernels import get_kernel, list_kernels
    kernel = get_kernel("ranges")
    out, lse = kernel(q, k, v, mask)          # q (S, Hq, D), k/v (S, Hkv, D); lse (Hq, S) fp32
    kernel.not_supported_reasons(problem)      # [] or human-readable reasons
"""

from lcab.kernels import (  # noqa: F401  (registration)
    flash_attn,
    flashmask,
    flex,
    magi_ffa,
    naive,
    ranges,
    reference,
    sdpa,
    sparse,
    te_cudnn,
    torch_varlen,
)

# isort: split
# Registered after the first group so the older kernels keep their table rows and colour slots.
from lcab.kernels import (  # noqa: F401  (registration)
    block_sparse_attn,
    fa4,
    flashinfer,
    sparse_flex,
    vsa,
)
from lcab.kernels.base import (
    Kernel,
    KernelCaps,
    PreparedAttention,
    Problem,
    check_shapes,
    empty_rows,
    lse_dtype,
)
from lcab.kernels.registry import KERNELS, get_kernel, list_kernels, register_kernel

__all__ = [
    "KERNELS",
    "Kernel",
    "KernelCaps",
    "PreparedAttention",
    "Problem",
    "check_shapes",
    "empty_rows",
    "get_kernel",
    "list_kernels",
    "lse_dtype",
    "register_kernel",
]
