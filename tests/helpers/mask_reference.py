"""Independent reference semantics of every mask pattern (no lcab code is used here).

Every predicate is written from the pattern definitions in the specification, as numpy over an
(i, j) index grid, so that the tests compare lcab's slices against a brute-force ground truth.
The hypothesis strategies draw small sequence lengths and parameters that make every pattern
non-trivial (several documents, windows shorter than the sequence, ...).
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np
from hypothesis import strategies as st

#: Patterns built from packed documents with the shared document parameters.
DOC_PATTERNS = frozenset(
    {
        "full_document",
        "causal_document",
        "share_question",
        "causal_blockwise",
        "prefix_lm_document",
    }
)

#: Patterns whose attended set the reference below can compute exactly from the mask's
#: recorded documents/parameters.
EXACT_PATTERNS = frozenset(
    {
        "full",
        "causal",
        "sliding_window",
        "sliding_window_causal",
        "global_sliding_window",
        "prefix_lm_causal",
        "block_causal_document",
        *DOC_PATTERNS,
    }
)

#: Random block-sparse patterns: only structural properties can be checked.
SPARSE_PATTERNS = frozenset({"block_sparse", "varblock_sparse"})


# ----------------------------------------------------------------------------- grids
def grid(seqlen: int) -> tuple[np.ndarray, np.ndarray]:
    """Broadcastable index grids: query index (S, 1) and key index (1, S)."""
    idx = np.arange(seqlen)
    return idx[:, None], idx[None, :]


def doc_of(doc_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token: its document index d(x) and the start s_{d(x)} of that document."""
    lengths = np.asarray(doc_lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    d = np.repeat(np.arange(len(lengths)), lengths)
    return d, starts[d]


def reference_dense(name: str, seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
    """The attended set of a static pattern, from its definition (bool (S, S))."""
    i, j = grid(seqlen)  # query index i (rows), key index j (columns)
    if name == "full":
        return np.ones((seqlen, seqlen), dtype=bool)
    if name == "causal":
        return j <= i
    if name == "sliding_window":
        return np.abs(i - j) <= params["window"]
    if name == "sliding_window_causal":
        return (i - j >= 0) & (i - j <= params["window"])
    if name == "global_sliding_window":
        g = params["global_tokens"]
        return (np.abs(i - j) <= params["window"]) | (i < g) | (j < g)
    if name == "prefix_lm_causal":
        return (j < params["prefix"]) | (j <= i)
    # Everything below is made of documents.
    d, s = doc_of(doc_lengths)
    same = d[:, None] == d[None, :]
    d_i, d_j = d[:, None], d[None, :]
    if name == "full_document":
        return same
    if name == "causal_document":
        return same & (j <= i)
    if name == "share_question":
        return (same & (j <= i)) | ((d_j == 0) & (d_i != 0))
    if name == "causal_blockwise":
        last = len(doc_lengths) - 1
        return (same & (j <= i)) | ((d_i == last) & (d_j != last))
    if name == "prefix_lm_document":
        s_j = s[None, :]
        return same & ((j - s_j < params["prefix"]) | (j <= i))
    if name == "block_causal_document":
        B = params["block_size"]
        s_i, s_j = s[:, None], s[None, :]
        return same & ((j - s_j) // B <= (i - s_i) // B)
    raise KeyError(name)


def kept_blocks_expected(density_percent: int, n_blocks: int) -> int:
    """max(1, floor(rho * nK)) for rho = density_percent / 100, in exact arithmetic."""
    return max(1, int(Fraction(density_percent, 100) * n_blocks))


def splittable(n_blocks: int, lo: int, hi: int) -> bool:
    """Whether n_blocks can be cut into documents of lo..hi blocks each (brute force)."""
    reachable = {0}
    for total in range(1, n_blocks + 1):
        if any(total - b in reachable for b in range(lo, hi + 1)):
            reachable.add(total)
    return n_blocks in reachable


# ----------------------------------------------------------------------------- strategies
@st.composite
def compositions(draw: st.DrawFn, total: int, max_parts: int = 12) -> list[int]:
    """A random list of positive integers summing to ``total``."""
    if total == 1:
        return [1]
    k = draw(st.integers(0, min(max_parts, total) - 1))
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=k, max_size=k, unique=True)))
    bounds = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(bounds)]


@st.composite
def doc_params(draw: st.DrawFn, seqlen: int) -> dict[str, Any]:
    """Document parameters that give several documents at small seqlen."""
    source = draw(st.sampled_from(["explicit", "uniform", "fixed", "long", "auto"]))
    if source == "explicit":
        return {"doc_lengths": draw(compositions(seqlen))}
    if source == "uniform":
        lo = draw(st.integers(1, 24))
        hi = draw(st.integers(lo, 48))
        return {"doc_source": "uniform", "min_doc_len": lo, "max_doc_len": hi}
    if source == "fixed":
        return {"doc_source": "fixed", "doc_len": draw(st.integers(1, seqlen + 4))}
    if source == "long":
        lo = draw(st.integers(1, 40))
        hi = draw(st.integers(lo, 80))
        frac = draw(st.sampled_from([0.0, 0.25, 0.6, 1.0]))
        return {
            "doc_source": "long",
            "long_min_len": lo,
            "long_max_len": hi,
            "long_fraction": frac,
        }
    return {}


@st.composite
def pattern_params(draw: st.DrawFn, name: str, max_seqlen: int = 160) -> tuple[int, dict[str, Any]]:
    """(seqlen, params) for pattern ``name`` with small, interesting values."""
    if name == "block_causal_document":
        B = draw(st.integers(1, 12))
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, 6))
        feasible = [n for n in range(1, max(1, max_seqlen // B) + 1) if splittable(n, lo, hi)]
        n_blocks = draw(st.sampled_from(feasible or [hi]))
        return B * n_blocks, {"block_size": B, "min_blocks": lo, "max_blocks": hi}
    seqlen = draw(st.integers(1, max_seqlen))
    if name in DOC_PATTERNS:
        params = draw(doc_params(seqlen))
        if name == "prefix_lm_document":
            params["prefix"] = draw(st.none() | st.integers(0, seqlen))
        return seqlen, params
    if name in ("sliding_window", "sliding_window_causal"):
        return seqlen, {"window": draw(st.integers(0, seqlen + 3))}
    if name == "global_sliding_window":
        return seqlen, {
            "window": draw(st.integers(0, seqlen + 3)),
            "global_tokens": draw(st.integers(0, seqlen)),
        }
    if name == "prefix_lm_causal":
        return seqlen, {"prefix": draw(st.none() | st.integers(0, seqlen))}
    if name == "block_sparse":
        return seqlen, {
            "block_size": draw(st.integers(1, seqlen + 8)),
            "density": draw(st.integers(1, 100)) / 100,
            "heads": draw(st.integers(1, 3)),
        }
    if name == "varblock_sparse":
        avg = draw(st.integers(1, max(1, seqlen // 2)))
        return seqlen, {
            "avg_block_size": avg,
            "min_block_size": draw(st.integers(1, avg)),
            "density": draw(st.integers(1, 100)) / 100,
            "heads": draw(st.integers(1, 3)),
        }
    # A pattern registered after these tests were written: defaults at a small length.
    return draw(st.sampled_from([64, 128, 256])), {}
