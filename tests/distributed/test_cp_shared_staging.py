"""Ranks that share a GPU: every CP transfer staged through host buffers, forced on CPU.

Each strategy at world 2 and 4 runs forward and backward with ``LCAB_CP_HOST_STAGING=all`` (the
mode a numerics-only run on one GPU uses for point-to-point transfers, extended to every
collective) and must match the fp64 reference as plain gloo does, with the measured bytes equal
to the analytic volume; a rank that made no host copy fails its world, so the staged path is
the one that ran.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.distributed.grid import Case, rank_main, run_grid
from tests.distributed.test_cp_grid import mask_params, strategies

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

MASKS = ("causal", "causal_document", "sliding_window")
HEADS = (24, 6)  # GQA 4:1: query heads grouped per KV head across ranks


def staged_rank(rank: int, world: int, rendezvous: str, messages: Any, cases: list[Case]) -> None:
    """`rank_main` with every transfer staged; fails if nothing went through the host."""
    from lcab.distributed import staging

    os.environ[staging.STAGING_ENV] = "all"
    rank_main(rank, world, rendezvous, messages, cases)
    if staging.mode() != "all" or staging._COPIES[0] == 0:
        raise RuntimeError(f"staging mode {staging.mode()}, {staging._COPIES[0]} host copies")


def cases(world: int) -> list[Case]:
    out = []
    for strategy, options in strategies(world):
        for mask in MASKS:
            opts = tuple(sorted({**options, "balance": "zigzag"}.items()))
            out.append(Case(strategy, opts, mask, mask_params(mask, HEADS[1]), 101, *HEADS))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_staged_transfers_match_reference_and_analytic_bytes(world, tmp_path):
    grid = cases(world)
    assert {c.strategy for c in grid} == {"ulysses", "ring", "ring_allgather", "usp", "loongtrain"}
    outcomes = run_grid(world, grid, tmp_path, rank_fn=staged_rank)
    assert len(outcomes) == len(grid)
    assert all(o.status == "ok" for o in outcomes), "\n".join(
        f"{o.case.label()}: {o.status} {o.detail} {o.errors}" for o in outcomes if o.status != "ok"
    )
