"""Every CP strategy x world size x mask x GQA/MHA x balancer equals the fp64 reference.

Outputs and dq/dk/dv of the distributed call are compared with the single-process fp64
reference, and every rank's measured communication (bytes per operation) must equal the
strategy's analytic volume. S = 101 is odd, so every balancer pads.
"""

from __future__ import annotations

import dataclasses

import pytest

from lcab.cp import STRATEGIES
from lcab.cp.balance import BALANCERS
from lcab.masks import get_pattern, list_masks
from tests.distributed.grid import Case, run_grid

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1500)]

SEQLEN = 101
HEADS = [(24, 24), (24, 6)]  # MHA and GQA 4:1; 24 heads divide over 2, 4, 6 and 8 ranks
PARAMS = {
    "sliding_window": {"window": 9},
    "sliding_window_causal": {"window": 9},
    "global_sliding_window": {"window": 7, "global_tokens": 5},
    "prefix_lm_causal": {"prefix": 30},
    "block_causal_document": {"block_size": 1},  # 101 is prime: blocks of 1 token
    "block_sparse": {"block_size": 16, "density": 0.4},
    "varblock_sparse": {"avg_block_size": 24, "min_block_size": 8, "density": 0.4},
}
DOCS = {"doc_source": "uniform", "min_doc_len": 3, "max_doc_len": 40}


def mask_params(name: str, heads_kv: int) -> tuple:
    params = dict(PARAMS.get(name, {}))
    names = get_pattern(name).param_names()
    if "doc_source" in names:
        params.update(DOCS)
    if "heads" in names:
        params["heads"] = heads_kv
    return tuple(sorted(params.items()))


def strategies(world: int) -> list[tuple[str, dict]]:
    """Every registered strategy; one with a Ulysses degree in 2-D layouts of ``world``.

    Ulysses groups of 2 and of half the world; a strategy with windows instead a double ring
    over every rank (degree 1) and groups of 2 — each with a ring of more than one rank.
    """
    out: list[tuple[str, dict]] = []
    for name in STRATEGIES.names():
        fields = {f.name for f in dataclasses.fields(STRATEGIES.get(name).options_cls)}
        if "ulysses_degree" not in fields:
            out.append((name, {}))
            continue
        windows = "window_count" in fields
        degrees = {1, 2} if windows else {2, world // 2}
        out += [
            (name, {"ulysses_degree": d})
            for d in sorted(degrees)
            if world % d == 0 and (d < world if windows else d >= 2)
        ]
    return out


def heads(world: int) -> list[tuple[int, int]]:
    """MHA and GQA at 2 and 4 ranks; GQA alone at 6 and 8.

    GQA is the harder case there (query heads grouped per KV head across ranks, and at 8 ranks
    its 6 KV heads replicated); MHA's 24 heads split as plainly as at 2 and 4, so it is dropped
    at 6 and 8 to keep CI inside its 30 minutes (the world-8 grid took 173 s with both).
    """
    return HEADS if world <= 4 else [h for h in HEADS if h[0] != h[1]]


def cases(world: int) -> list[Case]:
    grid = []
    for strategy, options in strategies(world):
        for balance in BALANCERS:
            for mask in list_masks():
                for hq, hkv in heads(world):
                    opts = tuple(sorted({**options, "balance": balance}.items()))
                    grid.append(Case(strategy, opts, mask, mask_params(mask, hkv), SEQLEN, hq, hkv))
    return grid


@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_every_strategy_mask_and_balancer_matches_reference(world, tmp_path):
    grid = cases(world)
    outcomes = run_grid(world, grid, tmp_path)
    assert len(outcomes) == len(grid)
    failed = [o for o in outcomes if o.status == "failed"]
    assert not failed, "\n".join(f"{o.case.label()}: {o.detail} {o.errors}" for o in failed[:10])
    # nothing is skipped except by a stated reason (here: none, the heads divide everywhere)
    skipped = [o for o in outcomes if o.status == "skipped"]
    assert not skipped, [f"{o.case.label()}: {o.detail}" for o in skipped[:5]]


@pytest.mark.parametrize("kernel", ["sdpa", "naive", "sparse"])
def test_other_cpu_kernels_are_valid_local_kernels(tmp_path, kernel):
    """Every CPU kernel the strategy matrix admits gives the reference result under CP."""
    grid = [
        Case(
            s,
            tuple(sorted({**o, "balance": "zigzag"}.items())),
            m,
            mask_params(m, 6),
            SEQLEN,
            24,
            6,
            kernel=kernel,
        )
        for s, o in strategies(4)
        for m in ("causal", "causal_document", "share_question", "block_sparse")
    ]
    failed = [o for o in run_grid(4, grid, tmp_path) if o.status != "ok"]
    assert not failed, [(o.case.label(), o.detail, o.errors) for o in failed]


def test_backward_repeats_on_one_forward(tmp_path):
    """The benchmark times backward by repeating it on one forward graph (retain_graph): every
    strategy must give the same, correct gradients on the second call."""
    grid = [
        Case(
            s,
            tuple(sorted({**o, "balance": "zigzag"}.items())),
            "causal_document",
            mask_params("causal_document", 6),
            SEQLEN,
            24,
            6,
            backward_calls=3,
        )
        for s, o in strategies(4)
    ]
    failed = [o for o in run_grid(4, grid, tmp_path) if o.status != "ok"]
    assert not failed, [(o.case.label(), o.detail, o.errors) for o in failed]
