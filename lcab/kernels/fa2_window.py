"""How to spell a window so that FlashAttention 2 applies exactly the lowering's mask.

FA2's C++ rewrites the window it is given (flash-attn 2.8.3 ``csrc/flash_attn/flash_api.cpp``):
``causal`` sets right = 0 (L404, L586); a side ≥ seqlen_k becomes -1 (L399-400, L608-609); an
unbounded side facing a bounded one becomes seqlen_k (L141-142); and the varlen forward takes a
"swapped" GQA path when ``max_seqlen_q == 1`` with both sides -1 as given (L592), which breaks on
key-only sequences. `fa2_spelling` tries spellings that mean the same window (an unbounded side
as ``max_seqlen_k - 1`` or ``max_seqlen_k``), applies FA2's rewrite, and keeps the first whose
rows equal the lowering's; when none does, the mask is refused (`fa2_window_reason`).
"""

from __future__ import annotations

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.lowering import VarlenArgs, to_varlen, varlen_reason
from lcab.masks.lowering.varlen import varlen_row_intervals


def fa2_applied(left: int, right: int, causal: bool, seqlen_k: int) -> tuple[int, int]:
    """The window FA2's kernel applies when given (left, right), steps 1-3 above."""
    if causal:
        right = 0
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    if left < 0 <= right:
        left = seqlen_k
    if left >= 0 > right:
        right = seqlen_k
    return left, right


def _rows(args: VarlenArgs, window: tuple[int, int], seqlen_q: int) -> tuple[np.ndarray, ...]:
    applied = VarlenArgs(
        args.cu_seqlens_q,
        args.cu_seqlens_k,
        args.max_seqlen_q,
        args.max_seqlen_k,
        args.causal,
        window,
    )
    return varlen_row_intervals(applied, seqlen_q)


def fa2_spelling(args: VarlenArgs, seqlen_q: int, gqa: bool) -> tuple[int, int] | None:
    """A (left, right) that FA2 applies as exactly ``args``' window; None if there is none.

    ``gqa``: the call has more query than KV heads, so the swapped path must be avoided.
    """
    longest_k = args.max_seqlen_k
    left, right = args.window_size
    want = varlen_row_intervals(args, seqlen_q)
    candidates = [
        (left, right),
        (longest_k - 1 if left < 0 else left, right),
        (left, longest_k - 1 if right < 0 else right),
        (longest_k if left < 0 else left, right),
    ]
    may_swap = gqa and not args.is_single_sequence and args.max_seqlen_q == 1
    for spelled in candidates:
        given_right = 0 if args.causal else spelled[1]
        if may_swap and spelled[0] < 0 and given_right < 0:
            continue  # FA2's swapped path (L592)
        applied = fa2_applied(*spelled, args.causal, longest_k)
        got = _rows(args, applied, seqlen_q)
        if np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]):
            return spelled
    return None


def fa2_window_reason(mask: AttnMask) -> str | None:
    """Why FA2 cannot apply ``mask``'s varlen window exactly (None: some spelling does)."""
    if mask.num_heads != 1 or varlen_reason(mask) is not None:
        return None  # refused as not expressible already
    args = to_varlen(mask)
    if fa2_spelling(args, mask.seqlen_q, gqa=False) is not None:
        return None
    return (
        f"FA2 cannot apply window_size {args.window_size}: it cuts a side >= max_seqlen_k="
        f"{args.max_seqlen_k} to that length (flash_api.cpp L608-609, L141-142), and this "
        "mask needs a wider window that still binds"
    )
