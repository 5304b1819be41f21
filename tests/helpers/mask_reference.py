"""Independent reference semantics of every mask pattern (no lcab code is used here).

Every predicate is written from the pattern definitions in the specification, as numpy over an
(i, j) index grid, so that the tests compare lcab's slices against a brute-force ground truth.
The hypothesis strategies draw small sequence lengths and parameters that make every pattern
non-trivial (several documents, windows shorter than the sequence, ...). `REFERENCES` holds one
entry per pattern: a registered pattern without one fails the tests (`reference_of`), it is
never skipped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from hypothesis import strategies as st

Expectation = Callable[[int, dict[str, Any], Any], np.ndarray]
"""(seqlen, the mask's recorded params, its doc_lengths) -> the attended set, bool (S, S)."""
Check = Callable[[Any, np.ndarray, int, dict[str, Any]], None]
"""(mask, its dense (H, S, S), seqlen, the params drawn) -> asserts the properties it must have."""


@dataclass(frozen=True)
class Reference:
    """What the tests know of one mask pattern, independently of lcab.

    ``dense``: its exact attended set (static patterns); ``check``: the properties a random
    pattern must have; ``params``: a hypothesis strategy of small (seqlen, params) that make it
    non-trivial; ``documents``: built from packed documents with the shared parameters;
    ``example``: the parameters of one mid-sized mask.
    """

    params: Callable[[int], st.SearchStrategy[tuple[int, dict[str, Any]]]]
    dense: Expectation | None = None
    check: Check | None = None
    documents: bool = False
    example: dict[str, Any] = field(default_factory=dict)
    """Parameters of a mid-sized example at any S divisible by 20 (160, 200: a few tiles)."""


REFERENCES: dict[str, Reference] = {}
"""Pattern name -> its reference; every registered pattern needs one (a test fails without)."""


def reference_of(name: str) -> Reference:
    """The reference of pattern ``name``.

    Raises:
        AssertionError: none is registered (add one here, or beside a plugin's pattern), so a
            new pattern cannot pass untested.

    """
    if name not in REFERENCES:
        raise AssertionError(
            f"mask {name!r} has no reference: register one in tests.helpers.mask_reference."
            "REFERENCES (its attended set or structural check, and a parameter strategy)"
        )
    return REFERENCES[name]


def register_reference(name: str, reference: Reference) -> None:
    """Add the reference of pattern ``name`` (a plugin's test module calls this)."""
    if name in REFERENCES:
        raise ValueError(f"mask {name!r} already has a reference")
    REFERENCES[name] = reference


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


def documents(doc_lengths: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Index grids i, j and, per pair, whether the tokens share a document, and d(i), d(j)."""
    d, _ = doc_of(doc_lengths)
    i, j = grid(len(d))
    return i, j, d[:, None] == d[None, :], d


def doc_starts(doc_lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    """s_{d(i)} as a column and s_{d(j)} as a row."""
    _, s = doc_of(doc_lengths)
    return s[:, None], s[None, :]


def share_question(seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
    i, j, same, d = documents(doc_lengths)
    return (same & (j <= i)) | ((d[None, :] == 0) & (d[:, None] != 0))


def causal_blockwise(seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
    i, j, same, d = documents(doc_lengths)
    last = len(doc_lengths) - 1
    return (same & (j <= i)) | ((d[:, None] == last) & (d[None, :] != last))


def prefix_lm_document(seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
    i, j, same, _ = documents(doc_lengths)
    return same & ((j - doc_starts(doc_lengths)[1] < params["prefix"]) | (j <= i))


def block_causal_document(seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
    i, j, same, _ = documents(doc_lengths)
    s_i, s_j = doc_starts(doc_lengths)
    return same & ((j - s_j) // params["block_size"] <= (i - s_i) // params["block_size"])


def reference_dense(name: str, seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
    """The attended set of a static pattern, from its definition (bool (S, S))."""
    dense = reference_of(name).dense
    assert dense is not None, f"{name} is random: only its structure can be checked"
    return np.broadcast_to(dense(seqlen, params, doc_lengths), (seqlen, seqlen))


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


def pattern_params(name: str, max_seqlen: int = 160) -> st.SearchStrategy[tuple[int, dict]]:
    """(seqlen, params) for pattern ``name`` with small, interesting values."""
    return reference_of(name).params(max_seqlen)


@st.composite
def no_params(draw: st.DrawFn, max_seqlen: int) -> tuple[int, dict[str, Any]]:
    return draw(st.integers(1, max_seqlen)), {}


@st.composite
def _doc_pattern_params(
    draw: st.DrawFn, max_seqlen: int, prefix: bool = False
) -> tuple[int, dict[str, Any]]:
    seqlen = draw(st.integers(1, max_seqlen))
    params = draw(doc_params(seqlen))
    if prefix:
        params["prefix"] = draw(st.none() | st.integers(0, seqlen))
    return seqlen, params


@st.composite
def _window_params(
    draw: st.DrawFn, max_seqlen: int, global_tokens: bool = False
) -> tuple[int, dict[str, Any]]:
    seqlen = draw(st.integers(1, max_seqlen))
    params = {"window": draw(st.integers(0, seqlen + 3))}
    if global_tokens:
        params["global_tokens"] = draw(st.integers(0, seqlen))
    return seqlen, params


@st.composite
def _prefix_params(draw: st.DrawFn, max_seqlen: int) -> tuple[int, dict[str, Any]]:
    seqlen = draw(st.integers(1, max_seqlen))
    return seqlen, {"prefix": draw(st.none() | st.integers(0, seqlen))}


@st.composite
def _block_causal_params(draw: st.DrawFn, max_seqlen: int) -> tuple[int, dict[str, Any]]:
    B = draw(st.integers(1, 12))
    lo = draw(st.integers(1, 3))
    hi = draw(st.integers(lo, 6))
    feasible = [n for n in range(1, max(1, max_seqlen // B) + 1) if splittable(n, lo, hi)]
    n_blocks = draw(st.sampled_from(feasible or [hi]))
    return B * n_blocks, {"block_size": B, "min_blocks": lo, "max_blocks": hi}


@st.composite
def _block_sparse_params(draw: st.DrawFn, max_seqlen: int) -> tuple[int, dict[str, Any]]:
    seqlen = draw(st.integers(1, max_seqlen))
    return seqlen, {
        "block_size": draw(st.integers(1, seqlen + 8)),
        "density": draw(st.integers(1, 100)) / 100,
        "heads": draw(st.integers(1, 3)),
    }


@st.composite
def _varblock_sparse_params(draw: st.DrawFn, max_seqlen: int) -> tuple[int, dict[str, Any]]:
    seqlen = draw(st.integers(1, max_seqlen))
    avg = draw(st.integers(1, max(1, seqlen // 2)))
    return seqlen, {
        "avg_block_size": avg,
        "min_block_size": draw(st.integers(1, avg)),
        "density": draw(st.integers(1, 100)) / 100,
        "heads": draw(st.integers(1, 3)),
    }


# ----------------------------------------------------------------------------- checks
def check_doc_lengths(mask: Any, seqlen: int, params: dict[str, Any]) -> None:
    """The mask's documents obey the document parameters it was made with."""
    lengths = mask.doc_lengths
    assert lengths is not None
    assert lengths.sum() == seqlen and (lengths >= 1).all()
    assert np.array_equal(mask.doc_boundaries, np.concatenate([[0], np.cumsum(lengths)]))
    if "doc_lengths" in params:
        assert lengths.tolist() == params["doc_lengths"]
    elif params.get("doc_source") == "fixed":
        n = params["doc_len"]
        expected = [n] * (seqlen // n) + ([seqlen % n] if seqlen % n else [])
        assert lengths.tolist() == expected
    elif params.get("doc_source") == "uniform":
        lo, hi = params["min_doc_len"], params["max_doc_len"]
        assert ((lengths[:-1] >= lo) & (lengths[:-1] <= hi)).all()
        assert lengths[-1] <= hi


def check_prefix(mask: Any, dense: np.ndarray, seqlen: int, params: dict[str, Any]) -> None:
    """The prefix, drawn or given, is recorded in the mask's params."""
    prefix = mask.params["prefix"]
    assert isinstance(prefix, (int, np.integer)) and 0 <= prefix <= seqlen
    if params["prefix"] is not None:
        assert prefix == params["prefix"]


def check_block_causal(mask: Any, dense: np.ndarray, seqlen: int, params: dict[str, Any]) -> None:
    """Every document, the last one included, has min_blocks..max_blocks whole blocks."""
    B = params["block_size"]
    blocks = mask.doc_lengths // B
    assert (mask.doc_lengths % B == 0).all()
    assert (blocks >= params["min_blocks"]).all() and (blocks <= params["max_blocks"]).all()


def check_block_sparse(mask: Any, dense: np.ndarray, seqlen: int, params: dict[str, Any]) -> None:
    """Constant on B x B blocks, max(1, floor(rho * nK)) kept key blocks per query block."""
    B, H = params["block_size"], params["heads"]
    assert dense.shape[0] == H
    n_blocks = -(-seqlen // B)
    block_of = np.arange(seqlen) // B
    first = block_of * B  # first token of each token's block
    # Constant on every block: each token pair equals the pair of its blocks' first tokens.
    assert np.array_equal(dense, dense[:, first][:, :, first])
    kept = dense[:, ::B, ::B]  # (H, nQ, nK) block picks
    assert kept.shape == (H, n_blocks, n_blocks)
    want = kept_blocks_expected(round(params["density"] * 100), n_blocks)
    assert (kept.sum(axis=-1) == want).all(), kept.sum(axis=-1)
    sizes = np.bincount(block_of, minlength=n_blocks)
    area = np.einsum("hqk,q,k->h", kept.astype(np.int64), sizes, sizes)
    assert area.tolist() == dense.sum(axis=(1, 2)).tolist()


def run_lengths(changes: np.ndarray, n: int) -> np.ndarray:
    """Lengths of the maximal runs of a sequence of n items, given where item x != item x-1."""
    bounds = np.concatenate([[0], np.flatnonzero(changes) + 1, [n]])
    return np.diff(bounds)


def check_varblock_sparse(
    mask: Any, dense: np.ndarray, seqlen: int, params: dict[str, Any]
) -> None:
    """A grid of whole blocks of >= min_block_size tokens; every query block keeps one."""
    assert dense.shape[0] == params["heads"]
    minimum = min(params["min_block_size"], seqlen)
    for head in dense:
        # Maximal runs of identical rows (columns) are whole blocks.
        row_runs = run_lengths((head[1:] != head[:-1]).any(axis=1), seqlen)
        col_runs = run_lengths((head[:, 1:] != head[:, :-1]).any(axis=0), seqlen)
        assert row_runs.min() >= minimum and col_runs.min() >= minimum
        assert head.any(axis=1).all()  # every query block keeps at least one key block


# ----------------------------------------------------------------------------- registry
def _same_doc(causal: bool) -> Expectation:
    def dense(seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
        i, j, same, _ = documents(doc_lengths)
        return same & (j <= i) if causal else same

    return dense


DOCS = {"doc_source": "uniform", "min_doc_len": 5, "max_doc_len": 70}
_WINDOWS: dict[str, Expectation] = {
    "sliding_window": lambda S, p, d: np.abs(grid(S)[0] - grid(S)[1]) <= p["window"],
    "sliding_window_causal": lambda S, p, d: (
        (grid(S)[0] - grid(S)[1] >= 0) & (grid(S)[0] - grid(S)[1] <= p["window"])
    ),
}
REFERENCES.update(
    {
        "full": Reference(no_params, dense=lambda S, p, d: np.ones((S, S), dtype=bool)),
        "causal": Reference(no_params, dense=lambda S, p, d: grid(S)[1] <= grid(S)[0]),
        "full_document": Reference(
            _doc_pattern_params, _same_doc(False), documents=True, example=DOCS
        ),
        "causal_document": Reference(
            _doc_pattern_params, _same_doc(True), documents=True, example=DOCS
        ),
        "share_question": Reference(
            _doc_pattern_params, share_question, documents=True, example=DOCS
        ),
        "causal_blockwise": Reference(
            _doc_pattern_params, causal_blockwise, documents=True, example=DOCS
        ),
        "prefix_lm_document": Reference(
            lambda m: _doc_pattern_params(m, prefix=True),
            prefix_lm_document,
            check_prefix,
            documents=True,
            example={**DOCS, "prefix": 20},
        ),
        "block_causal_document": Reference(
            _block_causal_params,
            block_causal_document,
            check_block_causal,
            example={"block_size": 20},
        ),
        **{
            name: Reference(_window_params, dense, example={"window": 20})
            for name, dense in _WINDOWS.items()
        },
        "global_sliding_window": Reference(
            lambda m: _window_params(m, global_tokens=True),
            lambda S, p, d: (
                (np.abs(grid(S)[0] - grid(S)[1]) <= p["window"])
                | (grid(S)[0] < p["global_tokens"])
                | (grid(S)[1] < p["global_tokens"])
            ),
            example={"window": 10, "global_tokens": 12},
        ),
        "prefix_lm_causal": Reference(
            _prefix_params,
            lambda S, p, d: (grid(S)[1] < p["prefix"]) | (grid(S)[1] <= grid(S)[0]),
            check_prefix,
            example={"prefix": 37},
        ),
        "block_sparse": Reference(
            _block_sparse_params,
            check=check_block_sparse,
            example={"block_size": 32, "density": 0.4, "heads": 2},
        ),
        "varblock_sparse": Reference(
            _varblock_sparse_params,
            check=check_varblock_sparse,
            example={"avg_block_size": 40, "min_block_size": 10, "heads": 2},
        ),
    }
)
