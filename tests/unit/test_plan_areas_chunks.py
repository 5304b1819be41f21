"""The planner's pair table counted from chunks gives, to the integer, what counting rows gives.

`lcab.plan.areas_chunks` counts a head from segments of rows (one slice, row shard and
document, whose spans stay in the same key chunks); `lcab.plan.areas._row_work(fast=False)` is the
row-by-row count it replaces. Random masks of every source (patterns with documents, windows,
prefixes, restricted rectangles, random slices, arbitrary dense masks, several heads) meet
random layouts (contiguous, zigzag, per document, permutations, runs, with padding, unequal
shards, tokens held by no shard, tokens in two shards) and every table must match; a dense
brute force, written here from the definitions, checks the pair table of small cases; the
README cell's shape (per-document zigzag over 96 ranks) must take the chunk path, which a
silent fallback to counting rows would fail.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lcab.cp import STRATEGIES
from lcab.kernels import Problem
from lcab.masks import make_mask
from lcab.masks.core import AttnMask
from lcab.masks.geometry import row_spans
from lcab.plan import areas_chunks
from lcab.plan.areas import PairWork, _row_work, pair_work
from lcab.plan.areas_chunks import Shards, head_work
from tests.helpers.masks import any_masks, dense3, fast

FIELDS = ("area", "rows", "runs", "cols", "col_docs", "longest_cols")
LAYOUTS = ("contiguous", "zigzag", "per_doc", "permutation", "runs")


def _cuts(rng: np.random.Generator, length: int, parts: int) -> list[int]:
    inner = np.sort(rng.integers(0, length + 1, size=parts - 1)).tolist()
    return [0, *inner, length]


def _zigzag(tokens: np.ndarray, shards: int) -> list[np.ndarray]:
    pieces = np.array_split(tokens, 2 * shards)
    return [np.concatenate([pieces[p], pieces[2 * shards - 1 - p]]) for p in range(shards)]


@st.composite
def layouts(
    draw: st.DrawFn, length: int, docs: np.ndarray | None, overlap: bool = True
) -> list[np.ndarray]:
    """Shards of ``length`` tokens (ids, -1 = padding) in one of the planner's shapes or worse."""
    kind = draw(st.sampled_from(LAYOUTS))
    n = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = np.arange(length, dtype=np.int64)
    if kind == "contiguous":
        cuts = _cuts(rng, length, n)
        sets = [tokens[a:b] for a, b in itertools.pairwise(cuts)]
    elif kind == "zigzag":
        sets = _zigzag(tokens, n)
    elif kind == "per_doc":  # every document zigzagged over all shards, as the balancer does
        bounds = np.concatenate([[0], np.cumsum(docs if docs is not None else [length])])
        per_doc = [_zigzag(tokens[a:b], n) for a, b in itertools.pairwise(bounds)]
        sets = [np.concatenate([d[p] for d in per_doc]) for p in range(n)]
    elif kind == "permutation":
        perm = rng.permutation(length)
        cuts = _cuts(rng, length, n)
        sets = [perm[a:b] for a, b in itertools.pairwise(cuts)]
    else:  # random runs dealt to random shards
        cuts = _cuts(rng, length, int(rng.integers(1, 12)))
        owner = rng.integers(0, n, size=len(cuts) - 1)
        sets = [
            np.concatenate([tokens[cuts[k] : cuts[k + 1]] for k in np.flatnonzero(owner == j)])
            if np.any(owner == j)
            else np.zeros(0, dtype=np.int64)
            for j in range(n)
        ]
    sets = [np.asarray(s, dtype=np.int64) for s in sets]
    if draw(st.booleans()):  # some tokens held by no shard
        sets = [s[rng.random(len(s)) > 0.2] for s in sets]
    if overlap and n > 1 and draw(st.booleans()):  # a few tokens in two shards
        extra = rng.integers(0, length, size=3)
        sets[0] = np.concatenate([sets[0], extra])
        sets[-1] = np.concatenate([extra, sets[-1]])
    if draw(st.booleans()):  # padding, and tokens in no particular order
        sets = [np.insert(rng.permutation(s), 0, [-1, -1]) for s in sets]
    return sets


def _doc_starts(mask: AttnMask, per_doc: np.ndarray | None) -> np.ndarray:
    """Starts of documents 1.. as `_row_work` sees them (none for Sq != Sk)."""
    lengths = per_doc if per_doc is not None else mask.doc_lengths
    if lengths is None or len(lengths) == 0 or mask.seqlen_q != mask.seqlen_k:
        return np.zeros(0, dtype=np.int64)
    return np.cumsum(lengths)[:-1]


def _assert_same(got: PairWork, want: PairWork, fields: tuple[str, ...] = FIELDS) -> None:
    for field in fields:
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert a.dtype == b.dtype == np.float64, field
            np.testing.assert_array_equal(a, b, err_msg=field)


def _per_doc(draw: st.DrawFn, mask: AttnMask) -> np.ndarray | None:
    choice = draw(st.sampled_from(["none", "mask", "one", "random"]))
    if choice == "none":
        return None
    if choice == "mask" and mask.doc_lengths is not None:
        return np.asarray(mask.doc_lengths)
    if choice == "random" and mask.seqlen_q > 1:
        cuts = sorted(draw(st.sets(st.integers(1, mask.seqlen_q - 1), max_size=5)))
        return np.diff([0, *cuts, mask.seqlen_q])
    return np.asarray([mask.seqlen_q])


@fast(250)
@given(data=st.data())
def test_every_head_the_chunks_count_matches_counting_rows(data):
    """Forced through the chunks (no size threshold), each head equals the row count exactly."""
    mask = data.draw(any_masks(max_heads=3, max_seqlen=120))
    docs = mask.doc_lengths
    row_sets = data.draw(layouts(mask.seqlen_q, docs))
    col_sets = data.draw(layouts(mask.seqlen_k, docs))
    per_doc = _per_doc(data.draw, mask)
    rows, keys = Shards.of(row_sets, mask.seqlen_q), Shards.of(col_sets, mask.seqlen_k)
    starts = _doc_starts(mask, per_doc)
    for h in range(mask.num_heads):
        slices = mask.head_slices(h)
        got = head_work(slices, rows, keys, starts, per_doc is not None, True, math.inf)
        # the chunks stand for keys held once, and rows with one span
        several_spans = np.bincount(row_spans(slices)[0]).max(initial=0) > 1
        assert (got is not None) == (keys.disjoint and not several_spans)
        if got is None:
            continue
        want = _row_work(mask.head(h), row_sets, col_sets, per_doc, fast=False)
        for field in ("area", "rows", "runs", "col_docs", "longest_cols"):
            a, b = getattr(got, field), getattr(want, field)
            if b is None:
                assert a is None, field
            else:
                np.testing.assert_array_equal(a, b[0], err_msg=field)


@fast(150)
@given(data=st.data())
def test_row_work_and_pair_work_equal_the_row_count(data):
    """Through the dispatch (chunks, or rows where they cannot), every field is the same."""
    mask = data.draw(any_masks(max_heads=3, max_seqlen=120))
    docs = mask.doc_lengths
    row_sets = data.draw(layouts(mask.seqlen_q, docs))
    col_sets = data.draw(layouts(mask.seqlen_k, docs))
    per_doc = _per_doc(data.draw, mask)
    _assert_same(
        _row_work(mask, row_sets, col_sets, per_doc),
        _row_work(mask, row_sets, col_sets, per_doc, fast=False),
        ("area", "rows", "runs", "col_docs", "longest_cols"),
    )
    if mask.seqlen_q == mask.seqlen_k:
        if data.draw(st.booleans()):
            col_sets = row_sets  # the ring's case: one list, shared by both passes
        _assert_same(
            pair_work(mask, row_sets, col_sets), _reference_pair_work(mask, row_sets, col_sets)
        )


def _reference_pair_work(
    mask: AttnMask, row_sets: list[np.ndarray], col_sets: list[np.ndarray]
) -> PairWork:
    """`pair_work` as it was: the row count of the mask and of its transpose."""
    work = _row_work(mask, row_sets, col_sets, fast=False)
    lengths = np.asarray(mask.doc_lengths if mask.doc_lengths is not None else [mask.seqlen_q])
    keys = _row_work(mask.transpose(), col_sets, row_sets, lengths, fast=False)
    assert keys.col_docs is not None and keys.longest_cols is not None
    return PairWork(
        work.area,
        work.rows,
        work.runs,
        cols=keys.rows.transpose(0, 2, 1),
        col_docs=keys.col_docs.transpose(0, 2, 1),
        longest_cols=keys.longest_cols.transpose(0, 2, 1),
    )


def _dense_pair_work(
    mask: AttnMask, row_sets: list[np.ndarray], col_sets: list[np.ndarray]
) -> dict[str, np.ndarray]:
    """Every field from the dense mask, for shards that share no token (definitions only)."""
    dense = dense3(mask)
    heads, n_i, n_j = dense.shape[0], len(row_sets), len(col_sets)
    lengths = mask.doc_lengths if mask.doc_lengths is not None else [mask.seqlen_q]
    doc = np.repeat(np.arange(len(lengths)), lengths)
    out = {f: np.zeros((heads, n_i, n_j)) for f in FIELDS}
    for h in range(heads):
        for i, r in enumerate(row_sets):
            for j, c in enumerate(col_sets):
                r_ids, c_ids = np.sort(r[r >= 0]), np.sort(c[c >= 0])
                sub = dense[h][np.ix_(r_ids, c_ids)]
                out["area"][h, i, j] = sub.sum()
                active = r_ids[sub.any(axis=1)]
                out["rows"][h, i, j] = len(active)
                breaks = (np.diff(active) != 1) | (np.diff(doc[active]) != 0)
                out["runs"][h, i, j] = (len(active) > 0) + breaks.sum()
                attended = c_ids[sub.any(axis=0)]
                out["cols"][h, i, j] = len(attended)
                per_doc = np.bincount(doc[attended], minlength=len(lengths))
                out["col_docs"][h, i, j] = (per_doc > 0).sum()
                out["longest_cols"][h, i, j] = per_doc.max()
    return out


@fast(80)
@given(data=st.data())
def test_small_pair_tables_equal_a_dense_brute_force(data):
    mask = data.draw(
        any_masks(max_heads=2, max_seqlen=48).filter(lambda m: m.seqlen_q == m.seqlen_k)
    )
    row_sets = data.draw(layouts(mask.seqlen_q, mask.doc_lengths, overlap=False))
    col_sets = data.draw(layouts(mask.seqlen_k, mask.doc_lengths, overlap=False))
    work = pair_work(mask, row_sets, col_sets)
    want = _dense_pair_work(mask, row_sets, col_sets)
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(work, field), want[field], err_msg=field)


def test_a_causal_document_by_hand():
    """Two documents of 4 and 2 tokens; rows {0, 1, 4}, keys {0, 2, 3, 5} and {1, 4}."""
    mask = make_mask("causal_document", 6, doc_lengths=[4, 2])
    rows = [np.array([0, 1, 4]), np.array([2, 3, 5])]
    cols = [np.array([0, 2, 3, 5]), np.array([1, 4, -1])]
    work = pair_work(mask, rows, cols)
    # row 0 sees {0}, row 1 {0, 1}, row 4 {4}: keys of shard 0: 1 + 1 + 0, of shard 1: 0 + 1 + 1
    assert work.area[0, 0].tolist() == [2, 2]
    assert work.rows[0, 0].tolist() == [2, 2]
    assert work.runs[0, 0].tolist() == [1, 2]  # rows 1 and 4: not consecutive
    # rows 2 {0..2}, 3 {0..3}, 5 {4, 5}
    assert work.area[0, 1].tolist() == [2 + 3 + 1, 1 + 1 + 1]
    assert work.cols is not None and work.col_docs is not None and work.longest_cols is not None
    assert work.cols[0].tolist() == [[1, 2], [4, 2]]
    assert work.col_docs[0].tolist() == [[1, 2], [2, 2]]
    assert work.longest_cols[0].tolist() == [[1, 1], [3, 1]]


@pytest.mark.parametrize(
    "name,params",
    [
        ("share_question", {"doc_source": "uniform", "min_doc_len": 50, "max_doc_len": 200}),
        ("global_sliding_window", {"window": 64, "global_tokens": 16}),
        ("block_sparse", {"block_size": 32, "heads": 3}),
    ],
)
def test_rows_with_several_spans_are_counted_row_by_row(name, params):
    mask = make_mask(name, 600, seed=2, **params)
    tokens = np.arange(600)
    shards = [tokens[:250], tokens[250:]]
    rows, keys = Shards.of(shards, 600), Shards.of(shards, 600)
    starts = _doc_starts(mask, None)
    assert head_work(mask.head_slices(0), rows, keys, starts, False, True, math.inf) is None
    _assert_same(pair_work(mask, shards, shards), _reference_pair_work(mask, shards, shards))


@pytest.mark.parametrize("cp", ["ring", "ring_allgather"])
def test_the_readme_cell_shape_takes_the_chunk_path(cp, monkeypatch):
    """Per-document zigzag over 96 ranks, long documents: every head through the chunks."""
    mask = make_mask("causal_document", 96 * 2 * 64, seed=1, doc_source="long")
    problem = Problem(mask.seqlen_q, mask.seqlen_q, 64, 8, 128, torch.bfloat16)
    plan = STRATEGIES.get(cp)({}, 8).plan(mask, problem, 96)
    shards = list(plan.placement.layouts)
    col_sets = shards if cp == "ring" else [np.concatenate(shards)]
    counted = []

    def recording(*args, **kwargs):
        got = head_work(*args, **kwargs)
        counted.append(got is not None)
        return got

    monkeypatch.setattr(areas_chunks, "head_work", recording)
    work = pair_work(mask, shards, col_sets)
    assert counted == [True, True]  # the mask and its transpose, one head each
    _assert_same(work, _reference_pair_work(mask, shards, col_sets))


def test_tables_beyond_the_budget_are_counted_row_by_row(monkeypatch):
    mask = make_mask("causal", 300)
    tokens = np.arange(300)
    shards = [tokens[:100], tokens[100:]]
    rows = Shards.of(shards, 300)
    assert head_work(mask.head_slices(0), rows, rows, np.zeros(0, np.int64), False) is not None
    monkeypatch.setattr(areas_chunks, "MAX_TABLE", 5)
    assert head_work(mask.head_slices(0), rows, rows, np.zeros(0, np.int64), False) is None
    _assert_same(pair_work(mask, shards, shards), _reference_pair_work(mask, shards, shards))
