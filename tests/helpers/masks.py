"""Mask sources for property tests: every pattern, restricted windows, random slices, dense.

Nothing here calls an lcab lowering: masks are built with the public mask API (`make_mask`,
`AttnMask`, `AttnMask.from_dense`, `AttnMask.restrict`), and the ground truth of every check is
`AttnMask.to_dense`. The emulators of each kernel family's documented semantics live in the
test file of that lowering.

Mask sources:

* ``pattern_masks(name)`` — every registered pattern (registry-driven) with small random
  parameters that make it non-trivial; unknown (newly registered) patterns fall back to their
  defaults at a few small lengths;
* ``restricted(mask)`` — a random rectangle of a mask in local coordinates (Sq != Sk), as context
  parallelism hands it to a kernel;
* ``slice_masks()`` — random disjoint slices of every kind, including Sq != Sk slices and
  several heads;
* ``dense_masks()`` — arbitrary boolean masks (random bits, rectangles, row/column intervals,
  bands, empty, full), 1-3 heads.
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from lcab.masks import AttnMask, list_masks, make_mask
from tests.helpers.mask_reference import pattern_params

ALL_PATTERNS = list_masks()


#: Multiply every example budget, e.g. LCAB_LOWERING_EXAMPLES=50 for a long bug hunt.
EXAMPLES_SCALE = int(os.environ.get("LCAB_LOWERING_EXAMPLES", "1"))


def fast(n: int) -> settings:
    """Hypothesis settings for small, quick examples."""
    return settings(
        max_examples=n * EXAMPLES_SCALE,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ----------------------------------------------------------------------------- dense helpers
def dense3(mask: AttnMask) -> np.ndarray:
    """``mask.to_dense()`` as a numpy bool array of shape (H, Sq, Sk)."""
    d = mask.to_dense().numpy()
    assert d.dtype == np.bool_
    return d if d.ndim == 3 else d[None]


def kind_tile(m: int, n: int, kind: int) -> np.ndarray:
    """Attended pairs of one m x n slice of ``kind`` in local coordinates (spec definition)."""
    i = np.arange(m)[:, None]
    j = np.arange(n)[None, :]
    full = np.ones((m, n), dtype=bool)
    if kind == 0:
        return full
    if kind == 1:
        return full & (j <= i + n - m)
    if kind == 2:
        return full & (j >= i)
    if kind == 3:
        return (j <= i + n - m) & (j >= i)
    raise AssertionError(f"unknown kind {kind}")


def from_dense(dense: np.ndarray) -> AttnMask:
    """`AttnMask.from_dense` of an (H, Sq, Sk) array (2-D when H == 1)."""
    return AttnMask.from_dense(dense[0] if dense.shape[0] == 1 else dense)


# ----------------------------------------------------------------------------- pattern masks
@st.composite
def pattern_masks(draw: st.DrawFn, name: str, max_seqlen: int = 200) -> AttnMask:
    """A mask of registered pattern ``name`` with random small parameters and seed."""
    S, params = draw(pattern_params(name, max_seqlen))
    return make_mask(name, S, seed=draw(st.integers(0, 2**16)), **params)


@st.composite
def rectangles(draw: st.DrawFn, sq: int, sk: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """A random non-empty (q_range, k_range) inside [0, sq) x [0, sk)."""
    q0 = draw(st.integers(0, sq - 1))
    q1 = draw(st.integers(q0 + 1, sq))
    k0 = draw(st.integers(0, sk - 1))
    k1 = draw(st.integers(k0 + 1, sk))
    return (q0, q1), (k0, k1)


@st.composite
def restricted(draw: st.DrawFn, name: str, max_seqlen: int = 200) -> AttnMask:
    """A random rectangle of a pattern mask, in local coordinates (what CP feeds kernels)."""
    mask = draw(pattern_masks(name, max_seqlen))
    q_range, k_range = draw(rectangles(mask.seqlen_q, mask.seqlen_k))
    sub = mask.restrict(q_range, k_range)
    assert sub.shape == (q_range[1] - q_range[0], k_range[1] - k_range[0])
    return sub


# ----------------------------------------------------------------------------- random slices
@st.composite
def _partition(draw: st.DrawFn, total: int, max_parts: int) -> list[int]:
    k = draw(st.integers(1, min(total, max_parts)))
    cuts = sorted(draw(st.sets(st.integers(1, max(total - 1, 1)), min_size=k - 1, max_size=k - 1)))
    return [0, *cuts, total]


@st.composite
def slice_masks(
    draw: st.DrawFn, max_len: int = 120, max_heads: int = 1, kinds: tuple[int, ...] = (0, 1, 2, 3)
) -> AttnMask:
    """Disjoint random slices of every kind on a random grid (cells may be shrunk), per head."""
    sq = draw(st.integers(1, max_len))
    sk = draw(st.integers(1, max_len)) if draw(st.booleans()) else sq
    heads = draw(st.integers(1, max_heads))
    qb = draw(_partition(sq, 6))
    kb = draw(_partition(sk, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_empty = draw(st.sampled_from([0.0, 0.3, 0.7]))
    parts = []
    for _ in range(heads):
        rows = []
        for a in range(len(qb) - 1):
            for b in range(len(kb) - 1):
                if rng.random() < p_empty:
                    continue
                q0, q1, k0, k1 = qb[a], qb[a + 1], kb[b], kb[b + 1]
                if rng.random() < 0.3:  # shrink the cell to a random sub-rectangle
                    q0, q1 = np.sort(rng.integers(q0, q1 + 1, size=2))
                    k0, k1 = np.sort(rng.integers(k0, k1 + 1, size=2))
                    if q1 <= q0 or k1 <= k0:
                        continue
                kind = int(rng.choice(kinds))
                if not kind_tile(q1 - q0, k1 - k0, kind).any():
                    continue
                rows.append([q0, q1, k0, k1, kind])
        parts.append(np.asarray(rows, dtype=np.int64).reshape(-1, 5))
    ptr = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
    return AttnMask(np.concatenate(parts), sq, sk, head_ptr=ptr if heads > 1 else None)


# ----------------------------------------------------------------------------- random dense
DENSE_MODES = (
    "bits",
    "rects",
    "row_intervals",
    "row_pick",
    "col_intervals",
    "band",
    "empty",
    "full",
)


@st.composite
def dense_arrays(
    draw: st.DrawFn, max_len: int = 80, max_heads: int = 1, modes: tuple[str, ...] = DENSE_MODES
) -> np.ndarray:
    """An arbitrary boolean (H, Sq, Sk) array drawn from one of several generators."""
    sq = draw(st.integers(1, max_len))
    sk = draw(st.integers(1, max_len)) if draw(st.booleans()) else sq
    heads = draw(st.integers(1, max_heads))
    mode = draw(st.sampled_from(modes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = np.zeros((heads, sq, sk), dtype=bool)
    rows = np.arange(sq)[:, None]
    cols = np.arange(sk)[None, :]
    for h in range(heads):
        if mode == "bits":
            out[h] = rng.random((sq, sk)) < rng.choice([0.05, 0.3, 0.7, 0.95])
        elif mode == "rects":
            for _ in range(rng.integers(1, 6)):
                q0, q1 = np.sort(rng.integers(0, sq + 1, size=2))
                k0, k1 = np.sort(rng.integers(0, sk + 1, size=2))
                out[h, q0:q1, k0:k1] = True
        elif mode == "row_intervals":
            lo = rng.integers(0, sk + 1, size=sq)
            hi = rng.integers(0, sk + 1, size=sq)
            out[h] = (np.minimum(lo, hi)[:, None] <= cols) & (cols < np.maximum(lo, hi)[:, None])
        elif mode == "row_pick":  # each row one of a few shared intervals (or none)
            spans = np.sort(rng.integers(0, sk + 1, size=(rng.integers(1, 4), 2)), axis=1)
            pick = rng.integers(-1, len(spans), size=sq)
            lo = np.where(pick >= 0, spans[pick, 0], 0)
            hi = np.where(pick >= 0, spans[pick, 1], 0)
            out[h] = (lo[:, None] <= cols) & (cols < hi[:, None])
        elif mode == "col_intervals":
            lo = rng.integers(0, sq + 1, size=sk)
            hi = rng.integers(0, sq + 1, size=sk)
            out[h] = (np.minimum(lo, hi)[None, :] <= rows) & (rows < np.maximum(lo, hi)[None, :])
        elif mode == "band":
            off = rng.integers(-sq, sk + 1)
            a, b = np.sort(rng.integers(-10, 11, size=2))
            out[h] = (cols - rows - off >= a) & (cols - rows - off <= b)
        elif mode == "full":
            out[h] = True
        # "empty": nothing attended
    return out


@st.composite
def dense_masks(draw: st.DrawFn, max_len: int = 80, max_heads: int = 1) -> AttnMask:
    """`AttnMask.from_dense` of an arbitrary boolean array (see `dense_arrays`)."""
    arr = draw(dense_arrays(max_len, max_heads))
    mask = from_dense(arr)
    assert np.array_equal(dense3(mask), arr)
    return mask


@st.composite
def any_masks(draw: st.DrawFn, max_heads: int = 3, max_seqlen: int = 160) -> AttnMask:
    """A pattern mask, a restricted pattern mask, random slices or an arbitrary dense mask."""
    source = draw(st.sampled_from(["pattern", "restricted", "slices", "dense"]))
    if source in ("pattern", "restricted"):
        name = draw(st.sampled_from(ALL_PATTERNS))
        strat = pattern_masks if source == "pattern" else restricted
        return draw(strat(name, max_seqlen))
    if source == "slices":
        return draw(slice_masks(max_heads=max_heads))
    return draw(dense_masks(max_heads=max_heads))
