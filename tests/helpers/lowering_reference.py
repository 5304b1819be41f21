"""Test-only copies of lowerings as they were before the 1M-token speed work.

The fast lowerings in `lcab.masks.lowering` must return bit-for-bit what these return (same
arrays, dtypes and shapes); `tests/unit/test_lowering_fast.py` checks that over every mask
pattern. Kept verbatim (renamed ``*_reference``) so the check does not depend on the new code
(helpers they share with the new code, such as `_sequences`, are imported).
"""

from __future__ import annotations

import numpy as np
import torch

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, band_area, kind_bands
from lcab.masks.lowering import flashmask as fm
from lcab.masks.lowering import flex as fx
from lcab.masks.lowering import varlen as v
from lcab.masks.lowering.blocks import BlockTable, uniform_bounds
from lcab.masks.lowering.flex import FLEX_BLOCK, _head_group


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
    predicate = flex_mask_mod_reference(mask, heads_q)

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


def to_varlen_reference(mask: AttnMask) -> v.VarlenArgs:
    """The varlen arguments reproducing ``mask`` exactly.

    Raises:
        v.NotExpressible: per-head masks, rows attending several separate key ranges, sequences
            that do not pair up, or rows that do not follow one common window.

    """
    if mask.num_heads != 1:
        raise v.NotExpressible(
            "varlen kernels take one mask for all heads; this mask has "
            f"{mask.num_heads} (per-KV-head block-sparse)"
        )
    ri = mask.row_intervals()
    counts = np.diff(ri.ptr)
    if counts.max(initial=0) > 1:
        row = int(np.argmax(counts > 1))
        raise v.NotExpressible(
            f"query row {row} attends {int(counts[row])} separate key ranges; varlen kernels "
            f"allow one contiguous range per row"
        )
    q_spans, k_spans = v._sequences(mask)
    lens_q, lens_k = [], []
    pos_q = pos_k = 0
    for (q0, q1), (k0, k1) in zip(q_spans.tolist(), k_spans.tolist(), strict=True):
        if q0 > pos_q:  # queries attending nothing: a sequence with no keys
            lens_q.append(q0 - pos_q)
            lens_k.append(0)
        if k0 > pos_k:  # keys nobody attends: a sequence with no queries
            lens_q.append(0)
            lens_k.append(k0 - pos_k)
        lens_q.append(q1 - q0)
        lens_k.append(k1 - k0)
        pos_q, pos_k = q1, k1
    if pos_q < mask.seqlen_q:
        lens_q.append(mask.seqlen_q - pos_q)
        lens_k.append(0)
    if pos_k < mask.seqlen_k:
        lens_q.append(0)
        lens_k.append(mask.seqlen_k - pos_k)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)

    # Read the window off the attended rows.
    sq, sk = np.diff(cu_q), np.diff(cu_k)
    seq = np.repeat(np.arange(len(sq)), sq)
    has = counts == 1
    rows = np.flatnonzero(has)
    first = np.zeros(mask.seqlen_q, dtype=np.int64)
    last = np.zeros(mask.seqlen_q, dtype=np.int64)
    first[rows], last[rows] = ri.starts, ri.ends - 1
    r = np.arange(mask.seqlen_q) - cu_q[seq]
    diag = cu_k[seq] + r + sk[seq] - sq[seq]  # global key column of the aligned diagonal
    left = int((diag - first)[has].max(initial=0))
    right = int((last - diag)[has].max(initial=0))
    if left < 0 or right < 0:
        raise v.NotExpressible(
            "some row's keys end before or start after its aligned diagonal; FlashAttention "
            "windows always contain the diagonal"
        )
    # A side that never binds is unbounded (-1), the way FlashAttention spells it.
    if left >= int(sk.max(initial=0)) - 1:
        left = -1
    if right != 0 and right >= int(sq.max(initial=0)) - 1:
        right = -1
    args = v.VarlenArgs(
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=int(sq.max(initial=0)),
        max_seqlen_k=int(sk.max(initial=0)),
        causal=right == 0,
        window_size=(left, right),
    )
    exp_first, exp_end = v.varlen_row_intervals(args, mask.seqlen_q)
    exp_has = exp_end > exp_first
    same = (
        np.array_equal(exp_has, has)
        and np.array_equal(exp_first[has], first[has])
        and np.array_equal(exp_end[has], last[has] + 1)
    )
    if not same:
        bad = int(
            np.flatnonzero((exp_has != has) | (exp_first != first) | (exp_end != last + 1))[0]
        )
        raise v.NotExpressible(
            f"no single (causal, window_size) reproduces every sequence: query row {bad} differs "
            f"under window_size={args.window_size}"
        )
    return args


def to_flashmask_reference(mask: AttnMask) -> fm.FlashMaskArgs:
    """The smallest FlashMask column form reproducing ``mask`` exactly.

    Raises:
        v.NotExpressible: some key column attends more than three separate row ranges, or
            ranges in an order the column form cannot state.

    """
    sq, sk, heads = mask.seqlen_q, mask.seqlen_k, mask.num_heads
    ci = mask.transpose().row_intervals()  # rows of the transpose = key columns
    n = np.diff(ci.ptr)
    col = np.arange(heads * sk) % sk
    first = ci.ptr[:-1]
    has = n > 0
    idx0 = np.where(has, first, 0)
    idx_last = np.where(has, ci.ptr[1:] - 1, 0)
    s0 = np.where(has, ci.starts[idx0] if len(ci.starts) else 0, 0)
    e0 = np.where(has, ci.ends[idx0] if len(ci.ends) else 0, 0)
    s_last = np.where(has, ci.starts[idx_last] if len(ci.starts) else 0, 0)
    e_last = np.where(has, ci.ends[idx_last] if len(ci.ends) else 0, 0)
    shape = (1, heads, sk)

    # FlashMask's causal is bottom-right: its causal forms only on square masks
    lower_triangular = sq == sk and bool(np.all(~has | (s0 >= col)))
    if lower_triangular:
        # attended = [j, LTS) ∪ [LTE, Sq)
        one = (n == 0) | ((n == 1) & (s0 == col))
        if one.all():
            lts = np.where(n == 0, col, e0)
            return fm.FlashMaskArgs(lts.reshape(*shape, 1).astype(np.int32), True)
        head_at_diag = has & (s0 == col)
        two = (
            (n == 0)
            | ((n == 1) & ((s0 == col) | (e0 == sq)))
            | ((n == 2) & (s0 == col) & (e_last == sq))
        )
        if two.all():
            lts = np.where(head_at_diag, e0, col)
            tail = has & (e_last == sq) & ~((n == 1) & head_at_diag)
            lte = np.where(tail, s_last, sq)
            return fm.FlashMaskArgs(
                np.stack([lts, lte], -1).reshape(*shape, 2).astype(np.int32), True
            )
    if np.all(n <= 1):
        # attended = [UTE, LTS)
        ute = np.where(has, s0, 0)
        lts = np.where(has, e0, 0)
        return fm.FlashMaskArgs(np.stack([lts, ute], -1).reshape(*shape, 2).astype(np.int32), False)
    # attended = [0, UTS) ∪ [UTE, LTS) ∪ [LTE, Sq)
    top = has & (s0 == 0)
    bottom = has & (e_last == sq) & ~((n == 1) & top)
    middle = n - top - bottom
    if (middle > 1).any():
        j = int(np.flatnonzero(middle > 1)[0])
        raise v.NotExpressible(
            f"key column {j % sk} attends {int(n[j])} separate row ranges; FlashMask allows at "
            f"most [0, UTS), [UTE, LTS) and [LTE, Sq)"
        )
    uts = np.where(top, e0, 0)
    lte = np.where(bottom, s_last, sq)
    mid_idx = np.where(top, first + 1, first)
    mid_idx = np.minimum(mid_idx, max(len(ci.starts) - 1, 0))
    ute = np.where(middle == 1, ci.starts[mid_idx] if len(ci.starts) else 0, uts)
    lts = np.where(middle == 1, ci.ends[mid_idx] if len(ci.ends) else 0, ute)
    out = np.stack([lts, lte, uts, ute], -1).reshape(*shape, 4).astype(np.int32)
    return fm.FlashMaskArgs(out, False)


def flex_mask_mod_reference(mask: AttnMask, heads_q: int | None = None) -> fx.FlexMaskMod:
    """The compact exact predicate of ``mask`` for FlexAttention."""
    group = fx._head_group(mask, heads_q)
    ri = mask.row_intervals()
    width = max(ri.max_per_row(), 1)
    interval_bytes = 2 * 4 * mask.num_heads * mask.seqlen_q * width
    cell = fx._grid_cell(mask)
    if cell:
        nq, nk = -(-mask.seqlen_q // cell), -(-mask.seqlen_k // cell)
        if mask.num_heads * nq * nk <= interval_bytes:
            grid = np.zeros((mask.num_heads, nq, nk), dtype=bool)
            for h in range(mask.num_heads):
                for q0, q1, k0, k1, _ in mask.head_slices(h).tolist():
                    grid[h, q0 // cell : -(-q1 // cell), k0 // cell : -(-k1 // cell)] = True
            return fx.FlexMaskMod(
                "grid", group, mask.seqlen_q, mask.seqlen_k, grid=torch.from_numpy(grid), cell=cell
            )
    counts = np.diff(ri.ptr)
    rows = np.repeat(np.arange(len(counts)), counts)
    slot = np.arange(len(rows)) - np.repeat(ri.ptr[:-1], counts)
    starts = np.zeros((len(counts), width), dtype=np.int32)
    ends = np.zeros((len(counts), width), dtype=np.int32)
    starts[rows, slot] = ri.starts
    ends[rows, slot] = ri.ends
    return fx.FlexMaskMod(
        "intervals",
        group,
        mask.seqlen_q,
        mask.seqlen_k,
        starts=torch.from_numpy(starts),
        ends=torch.from_numpy(ends),
    )
