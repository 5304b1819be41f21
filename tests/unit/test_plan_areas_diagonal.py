"""Band-edge rows of every shard pair (`lcab.plan.areas_diagonal`) and the staircase they cost.

Two independent expectations: a brute force over each slice's dense mask (a row's attended
keys of one slice, whose first or last is not the slice's key edge, sit on a band edge), and
the `ranges` kernel's own work items, whose computed area the planner's staircase must match.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.kernels.ranges import DEFAULT_TILE, range_items
from lcab.masks import make_mask
from lcab.masks.core import AttnMask
from lcab.masks.factory import MASK_PATTERNS
from lcab.masks.remap import remap
from lcab.plan.areas import pair_work
from lcab.plan.areas_diagonal import diagonal_work
from lcab.plan.calibrate import whole_mask_call
from lcab.plan.hardware import load_profile
from lcab.plan.model import CostModel


def _brute_rows(mask: AttnMask, rows: list[np.ndarray], cols: list[np.ndarray]) -> np.ndarray:
    """Per head and pair: (row, edge key) of each slice's dense mask, counted pair by pair."""
    out = np.zeros((mask.num_heads, len(rows), len(cols)))
    row_sets = [set(shard.tolist()) for shard in rows]
    col_sets = [set(shard.tolist()) for shard in cols]
    for head in range(mask.num_heads):
        for piece in mask.head_slices(head):
            q0, q1, k0, k1, _ = (int(x) for x in piece)
            one = AttnMask(piece[None], mask.seqlen_q, mask.seqlen_k)
            dense = one.to_dense().numpy()
            for row in range(q0, q1):
                keys = np.flatnonzero(dense[row])
                if len(keys) == 0:
                    continue
                edges = [int(keys[-1])] if keys[-1] < k1 - 1 else []
                edges += [int(keys[0])] if keys[0] > k0 else []
                for key in edges:
                    for i, shard in enumerate(row_sets):
                        for j, other in enumerate(col_sets):
                            out[head, i, j] += row in shard and key in other
    return out


SMALL = {
    "block_causal_document": {"block_size": 64},
    "sliding_window": {"window": 100},
    "sliding_window_causal": {"window": 100},
    "global_sliding_window": {"window": 100, "global_tokens": 16},
    "varblock_sparse": {"avg_block_size": 64, "min_block_size": 16, "heads": 2},
}
"""Parameters that give these masks several slices and binding windows at a few hundred tokens."""


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(MASK_PATTERNS.names()),
    seqlen=st.integers(4, 10).map(lambda blocks: 64 * blocks),
    shards=st.integers(1, 4),
    seed=st.integers(0, 3),
)
def test_edge_rows_match_each_slices_dense_mask(
    name: str, seqlen: int, shards: int, seed: int
) -> None:
    mask = make_mask(name, seqlen, seed=seed, **SMALL.get(name, {}))
    tokens = np.random.default_rng(seed).permutation(seqlen)
    sets = [tokens[k::shards] for k in range(shards)]
    got = diagonal_work(mask, sets, sets)
    assert np.array_equal(got.rows, _brute_rows(mask, sets, sets))
    assert (got.runs <= got.rows).all() and ((got.runs > 0) == (got.rows > 0)).all()


def test_shards_that_share_tokens_are_counted_pair_by_pair() -> None:
    mask = make_mask("causal", 40)
    sets = [np.arange(0, 30), np.arange(20, 40), np.array([-1, 5, 25])]
    assert np.array_equal(diagonal_work(mask, sets, sets).rows, _brute_rows(mask, sets, sets))


def test_a_causal_mask_is_one_run_per_document_on_contiguous_shards() -> None:
    mask = make_mask("causal_document", 512, seed=1)
    lengths = np.asarray(mask.doc_lengths)
    got = diagonal_work(mask, [np.arange(512)], [np.arange(512)])
    assert got.runs[0, 0, 0] == np.count_nonzero(lengths > 1)  # a 1-token document has no edge
    assert got.rows[0, 0, 0] == int(np.sum(lengths - 1))  # every row but its document's last


def _computed_area(mask: AttnMask, tile: int) -> int:
    """Positions the `ranges` kernel computes: every work item's rows x its key pieces."""
    items = range_items(mask, tile)
    widths = np.add.reduceat(items.k1 - items.k0, items.ptr[:-1]) if len(items.head) else []
    return int(np.sum((items.q1 - items.q0) * np.asarray(widths)))


@pytest.mark.parametrize("seqlen", [1024, 3072])
@pytest.mark.parametrize(
    "name",
    [
        "causal",
        "causal_document",
        "share_question",
        "full",
        "prefix_lm_causal",
        "sliding_window",
        "causal_blockwise",
    ],
)
def test_the_staircase_is_what_the_ranges_kernel_computes(name: str, seqlen: int) -> None:
    mask = make_mask(name, seqlen)
    call = whole_mask_call(mask, 8, 8, 32)
    model = CostModel(load_profile("cpu_gloo_local"), "ranges", 1)
    assert model.rate.diagonal_rows == DEFAULT_TILE  # the profile costs the kernel's pieces
    share = model.diagonal_share(call)
    computed = _computed_area(mask, DEFAULT_TILE)
    assert computed >= mask.area()
    # runs taken at their mean length: within 3 % of the kernel's own pieces
    assert mask.area() / share == pytest.approx(computed, rel=0.03)


def test_the_pair_table_carries_the_edges_into_each_call() -> None:
    mask = make_mask("causal", 256)
    halves = [np.arange(0, 128), np.arange(128, 256)]
    work = pair_work(mask, halves, halves)
    assert work.diagonal_rows is not None and work.diagonal_runs is not None
    # causal on two contiguous halves: the diagonal lies in pairs (0, 0) and (1, 1) only
    assert work.diagonal_rows[0].tolist() == [[128.0, 0.0], [0.0, 127.0]]
    assert work.diagonal_runs[0].tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_a_kernel_without_the_figure_costs_no_staircase() -> None:
    mask = make_mask("causal", 1024)
    call = whole_mask_call(mask, 8, 8, 32)
    default = CostModel(load_profile("cpu_gloo_local"), "sdpa", 1)
    assert default.rate.diagonal_rows == 0
    assert default.diagonal_share(call) == 1.0


@pytest.mark.parametrize(
    ("name", "placement", "seqlen"),
    [
        ("causal", "zigzag", 4096),
        ("causal_document", "zigzag", 4096),
        ("share_question", "zigzag", 4096),
        ("prefix_lm_causal", "zigzag", 4096),
        ("causal", "strided", 1024),
        ("causal_document", "random", 1024),
        ("causal", "shuffled", 512),
        ("causal_document", "reversed", 1024),
    ],
)
def test_each_pair_costs_what_the_kernel_computes_on_its_sub_mask(
    name: str, placement: str, seqlen: int
) -> None:
    """A ring step runs the kernel on the pair's sub-mask (`lcab.masks.remap`): the pair's
    figures must give the area the kernel's own work items compute there.

    Within 5 %: the model takes a pair's runs at their mean length, and zigzag pairs of a
    document mask hold documents of many lengths (3.2 % off on ``causal_document``).
    """
    shards = 4
    mask = make_mask(name, seqlen, seed=2)
    if placement == "zigzag":
        chunks = np.array_split(np.arange(seqlen), 2 * shards)
        sets = [np.concatenate([chunks[k], chunks[2 * shards - 1 - k]]) for k in range(shards)]
    elif placement == "reversed":  # contiguous shards laid out back to front
        sets = [chunk[::-1] for chunk in np.array_split(np.arange(seqlen), shards)]
    elif placement == "strided":
        sets = [np.arange(k, seqlen, shards) for k in range(shards)]
    else:  # random tokens per shard, in order or not
        tokens = np.random.default_rng(0).permutation(seqlen)
        sets = [tokens[k::shards] for k in range(shards)]
        sets = [np.sort(t) for t in sets] if placement == "random" else sets
    work = pair_work(mask, sets, sets)
    model = CostModel(load_profile("cpu_gloo_local"), "ranges", 1)
    for i in range(shards):
        for j in range(shards):
            sub = remap(mask, sets[i], sets[j])
            if sub.area() == 0:
                continue
            call = dataclasses.replace(
                whole_mask_call(sub, 8, 8, 32),
                rows=float(work.rows[0, i, j]),
                mean_keys=float(work.mean_keys[0, i, j]),
                diagonal_rows=float(work.diagonal_rows[0, i, j]),
                diagonal_runs=float(work.diagonal_runs[0, i, j]),
            )
            assert work.area[0, i, j] == sub.area()
            modelled = sub.area() / model.diagonal_share(call)
            assert modelled == pytest.approx(_computed_area(sub, DEFAULT_TILE), rel=0.05), (i, j)
