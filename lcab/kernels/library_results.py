"""What every library adapter does to a library's result: lcab's LSE layout, dtype, empty rows.

Libraries return the log-sum-exp in their own layout — (B, H, S), (H, total), (total, H) — and
disagree on rows that attend no key (+inf, -inf, or undocumented). Each adapter states its
library's layout; `LibraryCall.convention` turns any of them into lcab's (Hq, Sq) in lcab's LSE
dtype and sets the empty rows from the mask (out 0, lse -inf), so CP merges never see a
library's convention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from lcab.kernels.base import PreparedAttention, Problem, empty_rows, lse_dtype
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

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


class LibraryCall(PreparedAttention):
    """A library's prepared call, whose result `convention` puts in lcab's convention.

    Subclasses name the library and the API generation they follow (for the errors), call
    `expect` in their constructor and return ``self.convention(...)`` from `run`.
    """

    library: ClassVar[str]
    follows: ClassVar[str]

    def expect(self, mask: AttnMask, problem: Problem, per_query_head: bool = False) -> None:
        """Note the result's shape and the mask's rows attending nothing.

        The empty rows are (Sq,) for a mask shared by all heads, else (Hq, Sq) (each mask
        head's rows repeated over its query group); whether there are any is read on the host,
        so a meta or fake device works too.
        """
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
        """The library's (out, lse) in lcab's convention: (Hq, Sq) LSE, empty rows 0 / -inf.

        ``out`` is packed (Sq, Hq, D); the LSE takes lcab's dtype for inputs of ``dtype``.
        """
        lse = lse_to_lcab(lse, layout, self.heads, self.seqlen, self.library, self.follows)
        lse = lse.to(lse_dtype(dtype))
        return lcab_empty_rows(out, lse, self.empty) if self.has_empty else (out, lse)
