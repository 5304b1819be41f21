"""What every library adapter does to a library's result: lcab's LSE layout, dtype, empty rows.

Libraries return the log-sum-exp in their own layout — (B, H, S), (H, total), (total, H) — and
disagree on rows that attend no key (+inf, -inf, or undocumented). Each adapter states its
library's layout; `to_lcab_convention` turns any of them into lcab's (Hq, Sq) in lcab's LSE dtype
and sets the empty rows from the mask (out 0, lse -inf), so CP merges never see a library's
convention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from lcab.kernels.base import lse_dtype
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

LseLayout = Literal["bhs", "ht", "th"]
"""``bhs`` (B, H, S) with B = 1, ``ht`` (H, total_q), ``th`` (total_q, H)."""


def lse_to_lcab(
    lse: torch.Tensor,
    layout: LseLayout,
    heads: int,
    seqlen: int,
    library: str = "FlashAttention",
    follows: str = "flash-attn 2.8 / FA3 hopper",
) -> torch.Tensor:
    """A library's LSE (natural log) in ``layout`` → lcab's (Hq, Sq).

    Shared by every adapter whose library returns an LSE in one of these layouts.

    Raises:
        RuntimeError: the shape is not the documented one for ``layout`` (an API change: better
            a failed cell than a silently transposed LSE merged by context parallelism).

    """
    expected = {"bhs": (1, heads, seqlen), "ht": (heads, seqlen), "th": (seqlen, heads)}[layout]
    if tuple(lse.shape) != expected:
        raise RuntimeError(
            f"{library} returned an LSE of shape {tuple(lse.shape)}; the documented "
            f"{layout} layout is {expected} (lcab's adapter follows {follows})"
        )
    if layout == "bhs":
        return lse[0]
    return lse.t() if layout == "th" else lse


def lcab_empty_rows(
    out: torch.Tensor, lse: torch.Tensor, empty: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply lcab's convention to rows attending no key: out 0 (packed (Sq, H, D)), lse -inf.

    ``empty`` is (Sq,) for a mask shared by all heads or (Hq, Sq) per query head. Libraries
    disagree on these rows (+inf, -inf, or undocumented), so adapters set them from the mask.
    """
    lse = lse.masked_fill(empty, float("-inf"))
    rows = empty[:, None, None] if empty.dim() == 1 else empty.t()[:, :, None]
    return out.masked_fill(rows, 0.0), lse


def to_lcab_convention(
    out: torch.Tensor,
    lse: torch.Tensor,
    layout: LseLayout,
    *,
    heads: int,
    seqlen: int,
    empty: torch.Tensor | None,
    dtype: torch.dtype,
    library: str,
    follows: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A library's (out, lse) in lcab's convention: (Hq, Sq) LSE in lcab's dtype, empty rows set.

    ``empty`` is the mask's rows attending nothing (see `lcab_empty_rows`), or None when it has
    none; ``dtype`` is the inputs' dtype (it decides lcab's LSE dtype).
    """
    lse = lse_to_lcab(lse, layout, heads, seqlen, library, follows).to(lse_dtype(dtype))
    return (out, lse) if empty is None else lcab_empty_rows(out, lse, empty)
