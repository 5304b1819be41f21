"""Numerics against the fp64 reference: which tensors, how normalised, which tolerance.

Errors are normalised by the reference's largest magnitude (max |x - ref| / max |ref|), so one
tolerance per dtype fits out, lse and gradients alike. NaN or a finite/-inf disagreement in the
LSE is an infinite error: it never passes. When the whole reference would not fit
(heads_q·Sq·Sk above ``numerics_full_max``), a sample of query rows is checked instead; the rows
check out, lse and dq exactly, while dk/dv (which sum over every row) are left unchecked.
"""

from __future__ import annotations

import math

import torch

#: Normalised max-error tolerance per dtype.
TOLERANCE = {
    torch.float64: 1e-8,
    torch.float32: 1e-3,
    torch.float16: 1e-2,
    torch.bfloat16: 5e-2,
}


def tolerance(dtype: torch.dtype, override: float | None = None) -> float:
    """The tolerance for ``dtype`` (or ``override``)."""
    return float(override) if override is not None else TOLERANCE.get(dtype, 5e-2)


def normalised_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |x - ref| / max(max |ref|, 1e-12) in float64; inf on NaN or shape mismatch."""
    if x.shape != ref.shape:
        return math.inf
    x64, ref64 = x.detach().double(), ref.detach().double()
    if torch.isnan(x64).any():
        return math.inf
    scale = max(float(ref64.abs().max()) if ref64.numel() else 0.0, 1e-12)
    return float((x64 - ref64).abs().max()) / scale if ref64.numel() else 0.0


def lse_error(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Error of a log-sum-exp: -inf exactly where the reference is -inf, else as above."""
    lse64, ref64 = lse.detach().double(), ref.detach().double()
    if lse64.shape != ref64.shape or torch.isnan(lse64).any():
        return math.inf
    ref_empty = torch.isinf(ref64)
    if not torch.equal(torch.isinf(lse64), ref_empty):
        return math.inf
    keep = ~ref_empty
    if not keep.any():
        return 0.0
    scale = max(float(ref64[keep].abs().max()), 1.0)
    return float((lse64[keep] - ref64[keep]).abs().max()) / scale
