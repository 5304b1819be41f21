"""Merging partial attention results by log-sum-exp (the step every ring strategy repeats).

Two partial results over disjoint key sets, (o1, l1) and (o2, l2), combine exactly into
o = e^(l1 - l) o1 + e^(l2 - l) o2 with l = log(e^l1 + e^l2). Rows that attended nothing so far
carry l = -inf and weight 0, so empty steps and padding rows never produce NaN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def merge_into(
    out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor
) -> None:
    """In place: (out, lse) ← merge((out, lse), (part, part_lse)); out (S, H, D), lse (H, S).

    As ``out += w (part - out)`` with w = e^l2 / (e^l1 + e^l2) = sigmoid(l2 - l1): five
    tensor operations fewer than weighting both sides (a ring merges once per step).
    """
    if part_lse.dtype != lse.dtype:
        part_lse = part_lse.to(lse.dtype)
    # rows still empty on both sides: -inf - -inf is NaN, their weight 0
    weight = torch.sigmoid(part_lse - lse).nan_to_num_(0.0)
    out.lerp_(part.to(out.dtype), weight.t().unsqueeze(-1))
    torch.logaddexp(lse, part_lse, out=lse)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Partial results and travelling gradients are kept in float32 (float64 for float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32
