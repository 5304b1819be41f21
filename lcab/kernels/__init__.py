"""Attention kernels behind one contract (`lcab.kernels.base`), registered by name.

Public API::

    from lcab.kernels import get_kernel, list_kernels
    kernel = get_kernel("ranges")
    out, lse = kernel(q, k, v, mask)          # q (S, Hq, D), k/v (S, Hkv, D); lse (Hq, S) fp32
    kernel.not_supported_reasons(problem)      # [] or human-readable reasons

Every module of this package is imported here, so a kernel registers by existing: a new
adapter is one file (its checklist: README.md "Adding a kernel").
"""

import importlib
import pkgutil

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

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "__main__":
        importlib.import_module(f"{__name__}.{_module.name}")

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
