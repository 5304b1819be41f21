"""Test-only copies of lowerings as they were before the 1M-token speed work.

The fast lowerings in `lcab.masks.lowering` must return bit-for-bit what these return (same
arrays, dtypes and shapes); `tests/unit/test_lowering_fast.py` checks that over every mask
pattern. Kept verbatim (renamed ``*_reference``) so the check does not depend on the new code.
"""

from __future__ import annotations

import numpy as np
import torch

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, band_area, kind_bands
from lcab.masks.lowering.blocks import BlockTable, uniform_bounds
from lcab.masks.lowering.flex import FLEX_BLOCK, _head_group, flex_mask_mod


def _expand(counts: IntArray) -> tuple[IntArray, IntArray]:
    """For counts c_n: (owner index n, position 0..c_n-1) of every expanded element."""
    owner = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    return owner, pos


def _bounds(length: int, spec: IntArray | int) -> IntArray:
    """Offsets from a uniform block size (any integer type) or an explicit offset array."""
    if np.ndim(spec) == 0:
        return uniform_bounds(length, int(spec))
    return np.asarray(spec, dtype=np.int64)


def block_table_reference(
    mask: AttnMask, q_bounds: IntArray | int, k_bounds: IntArray | int | None = None
) -> BlockTable:
    """Classify every tile of ``mask`` on the given block grid (offsets, or a uniform size)."""
    if k_bounds is None:
        k_bounds = q_bounds
    qb_arr = _bounds(mask.seqlen_q, q_bounds)
    kb_arr = _bounds(mask.seqlen_k, k_bounds)
    for name, b, n in (("q", qb_arr, mask.seqlen_q), ("k", kb_arr, mask.seqlen_k)):
        if b[0] != 0 or b[-1] != n or (np.diff(b) <= 0).any():
            raise ValueError(f"{name} block offsets must rise strictly from 0 to {n}")
    n_q, n_k = len(qb_arr) - 1, len(kb_arr) - 1
    s = mask.slices
    head = np.repeat(np.arange(mask.num_heads), np.diff(mask.head_ptr))
    lo, hi = kind_bands(*s.T)

    # (slice, query block) pairs.
    qb0 = np.searchsorted(qb_arr, s[:, 0], side="right") - 1
    qb1 = np.searchsorted(qb_arr, s[:, 1] - 1, side="right") - 1
    sid, pos = _expand(qb1 - qb0 + 1)
    qb = qb0[sid] + pos
    r0, r1 = qb_arr[qb], qb_arr[qb + 1]
    # Non-empty rows of the slice inside this query block.
    a = np.maximum.reduce([r0, s[sid, 0], s[sid, 2] - hi[sid]])
    c = np.minimum.reduce([r1, s[sid, 1], s[sid, 3] - lo[sid]])
    live = c > a
    sid, qb, r0, r1, a, c = sid[live], qb[live], r0[live], r1[live], a[live], c[live]
    s_lo, s_hi = lo[sid], hi[sid]
    ks, ke = s[sid, 2], s[sid, 3]
    first_col = np.maximum(ks, a + s_lo)
    last_col = np.minimum(ke - 1, c - 1 + s_hi)
    kb0 = np.searchsorted(kb_arr, first_col, side="right") - 1
    kb1 = np.searchsorted(kb_arr, last_col, side="right") - 1
    # Tiles covered completely: all block rows inside the slice, and the key block inside
    # [L(last row), R(first row)] (the edges only move right as rows go down).
    rows_whole = (a == r0) & (c == r1)
    inner_lo = np.maximum(ks, r1 - 1 + s_lo)
    inner_hi = np.minimum(ke - 1, r0 + s_hi)
    fb0 = np.searchsorted(kb_arr, inner_lo, side="left")
    fb1 = np.searchsorted(kb_arr, inner_hi + 1, side="right") - 2
    fb0 = np.maximum(fb0, kb0)
    fb1 = np.minimum(fb1, kb1)
    has_full = rows_whole & (fb1 >= fb0)
    fb0 = np.where(has_full, fb0, kb1 + 1)
    fb1 = np.where(has_full, fb1, kb1)

    # Full tiles: runs [fb0, fb1].
    f_owner, f_pos = _expand(np.where(has_full, fb1 - fb0 + 1, 0))
    full_key = (head[sid[f_owner]] * n_q + qb[f_owner]) * n_k + fb0[f_owner] + f_pos
    # Partial contributions: [kb0, fb0) and (fb1, kb1].
    left_n = np.where(has_full, fb0 - kb0, kb1 - kb0 + 1)
    right_n = np.where(has_full, kb1 - fb1, 0)
    l_owner, l_pos = _expand(left_n)
    r_owner, r_pos = _expand(right_n)
    p_owner = np.concatenate([l_owner, r_owner])
    p_kb = np.concatenate([kb0[l_owner] + l_pos, fb1[r_owner] + 1 + r_pos])
    p_area = band_area(
        a[p_owner],
        c[p_owner],
        np.maximum(ks[p_owner], kb_arr[p_kb]),
        np.minimum(ke[p_owner], kb_arr[p_kb + 1]),
        s_lo[p_owner],
        s_hi[p_owner],
    )
    p_key = (head[sid[p_owner]] * n_q + qb[p_owner]) * n_k + p_kb

    tile_area = np.diff(qb_arr)[:, None] * np.diff(kb_arr)[None, :]
    keys = np.concatenate([full_key, p_key])
    areas = np.concatenate([tile_area.reshape(-1)[full_key % (n_q * n_k)], p_area])
    uniq, inverse = np.unique(keys, return_inverse=True)
    coverage = np.bincount(inverse.reshape(-1), weights=areas, minlength=len(uniq)).astype(np.int64)
    full = coverage == tile_area.reshape(-1)[uniq % (n_q * n_k)]
    row = uniq // n_k
    ptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=mask.num_heads * n_q))])
    entry_of_partial = inverse.reshape(-1)[len(full_key) :]
    return BlockTable(
        q_bounds=qb_arr,
        k_bounds=kb_arr,
        num_heads=mask.num_heads,
        ptr=ptr.astype(np.int64),
        kv_block=(uniq % n_k).astype(np.int64),
        full=full,
        coverage=coverage,
        partial_slice=sid[p_owner],
        partial_entry=entry_of_partial.astype(np.int64),
    )


def _ordered(
    rows: IntArray, cols: IntArray, n_rows: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR entries (already sorted by row, col) → (num (n_rows,), indices (n_rows, width))."""
    num = np.bincount(rows, minlength=n_rows).astype(np.int32)
    idx = np.zeros((n_rows, max(width, 1)), dtype=np.int32)
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(num) - num, num)
    idx[rows, slot] = cols
    return torch.from_numpy(num), torch.from_numpy(idx)


def flex_block_mask_reference(
    mask: AttnMask,
    *,
    heads_q: int | None = None,
    block_size: int = FLEX_BLOCK,
    device: str | torch.device = "cpu",
    table: BlockTable | None = None,
) -> torch.nn.attention.flex_attention.BlockMask:
    """FlexAttention `BlockMask` of ``mask``: tiles from slice geometry, exact `mask_mod`.

    Head-shared masks give a BlockMask with one head that broadcasts over query heads; per-KV-head
    masks are expanded to ``heads_q`` heads (query head h uses mask head h // (heads_q / H)).
    """
    from torch.nn.attention.flex_attention import BlockMask

    group = max(_head_group(mask, heads_q), 1)
    table = table if table is not None else block_table_reference(mask, block_size)
    n_q, n_k = table.num_q_blocks, table.num_k_blocks
    rows = np.repeat(np.arange(len(table.ptr) - 1), np.diff(table.ptr))
    cols, full, heads = table.kv_block, table.full, mask.num_heads
    if group > 1:  # query head h reads mask head h // group: repeat rows, keep them sorted
        mask_head, qb = np.divmod(rows, n_q)
        g = np.tile(np.arange(group), len(rows))
        rows = (np.repeat(mask_head, group) * group + g) * n_q + np.repeat(qb, group)
        cols, full = np.repeat(cols, group), np.repeat(full, group)
        order = np.lexsort((cols, rows))
        rows, cols, full = rows[order], cols[order], full[order]
        heads = mask.num_heads * group
    n_rows = heads * n_q
    # Flex reads the number of key blocks from the last dimension of the index tensors.
    kv_num, kv_idx = _ordered(rows[~full], cols[~full], n_rows, n_k)
    full_num, full_idx = _ordered(rows[full], cols[full], n_rows, n_k)
    # The query-major view (for the backward pass), transposed from the same sparse entries
    # rather than by BlockMask.from_kv_blocks's dense argsort over every tile.
    head, qb = np.divmod(rows, n_q)
    t_rows = head * n_k + cols
    order = np.lexsort((qb, t_rows))
    t_rows, t_cols, t_full = t_rows[order], qb[order], full[order]
    q_num, q_idx = _ordered(t_rows[~t_full], t_cols[~t_full], heads * n_k, n_q)
    full_q_num, full_q_idx = _ordered(t_rows[t_full], t_cols[t_full], heads * n_k, n_q)
    predicate = flex_mask_mod(mask, heads_q)

    def put(x: torch.Tensor, rows_per_head: int) -> torch.Tensor:
        return x.reshape(1, heads, rows_per_head, *x.shape[1:]).to(device)

    return BlockMask(
        seq_lengths=(mask.seqlen_q, mask.seqlen_k),
        kv_num_blocks=put(kv_num, n_q),
        kv_indices=put(kv_idx, n_q),
        full_kv_num_blocks=put(full_num, n_q),
        full_kv_indices=put(full_idx, n_q),
        q_num_blocks=put(q_num, n_k),
        q_indices=put(q_idx, n_k),
        full_q_num_blocks=put(full_q_num, n_k),
        full_q_indices=put(full_q_idx, n_k),
        BLOCK_SIZE=(block_size, block_size),
        mask_mod=predicate.as_mask_mod(),
    )
