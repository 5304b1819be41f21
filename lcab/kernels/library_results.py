"""What every library adapter does to a library's result: lcab's LSE layout, dtype, empty rows.

Libraries return the LSE in their own layout and disagree on rows that attend no key, so
`LibraryCall.convention` puts every result in lcab's (Hq, Sq), out 0 / lse -inf convention.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from lcab.kernels.base import PreparedAttention, Problem, empty_rows, lse_dtype
from lcab.kernels.upstream.facts import UpstreamFunction
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

LseLayout = Literal["bhs", "ht", "th"]
"""``bhs`` (B, H, S) with B = 1, ``ht`` (H, total_q), ``th`` (total_q, H)."""


def lse_reading(row: UpstreamFunction) -> tuple[float, LseLayout]:
    """What ``row``'s LSE is multiplied by to be natural log, and its layout, as the table says."""
    layout = None if row.lse is None else row.lse.layout
    if row.lse is None or layout not in ("bhs", "ht", "th"):
        raise ValueError(f"{row.qualname}: lcab's table states no LSE lcab can read ({layout})")
    return (math.log(2.0) if row.lse.base == "2" else 1.0), layout


def cu_seqlens(values: Any, device: torch.device | str) -> torch.Tensor:
    """Cumulative sequence lengths as the varlen libraries take them: contiguous int32."""
    return torch.as_tensor(values, dtype=torch.int32).to(device).contiguous()


def lse_to_lcab(
    lse: torch.Tensor,
    layout: LseLayout,
    heads: int,
    seqlen: int,
    library: str = "FlashAttention",
    follows: str = "flash-attn 2.8 / FA3 hopper",
) -> torch.Tensor:
    """A library's LSE (natural log) in ``layout`` → lcab's (Hq, Sq).

    Any other shape is a RuntimeError: better a failed cell than a silently transposed LSE.
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


class LibraryCall(PreparedAttention):
    """A library's prepared call: `expect` in the constructor, ``self.convention`` in `run`."""

    library: ClassVar[str]
    follows: ClassVar[str]

    def expect(self, mask: AttnMask, problem: Problem, per_query_head: bool = False) -> None:
        """Note the result's shape and the mask's empty rows, (Sq,) or (Hq, Sq), on the host."""
        self.heads, self.seqlen = problem.heads_q, problem.seqlen_q
        empty = empty_rows(mask)  # (mask heads, Sq)
        if mask.num_heads == 1 and not per_query_head:
            empty = empty[0]
        else:
            empty = empty.repeat_interleave(problem.heads_q // mask.num_heads, 0)
        self.has_empty = bool(empty.any())
        self.empty = empty.to(problem.device)

    def convention(
        self, out: torch.Tensor, lse: torch.Tensor, layout: LseLayout, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The library's (out, lse) in lcab's convention: (Hq, Sq) LSE, empty rows 0 / -inf."""
        lse = lse_to_lcab(lse, layout, self.heads, self.seqlen, self.library, self.follows)
        lse = lse.to(lse_dtype(dtype))
        if not self.has_empty:
            return out, lse
        empty = self.empty  # (Sq,) or (Hq, Sq); out is packed (Sq, Hq, D)
        rows = empty[:, None, None] if empty.dim() == 1 else empty.t()[:, :, None]
        return out.masked_fill(rows, 0.0), lse.masked_fill(empty, float("-inf"))
