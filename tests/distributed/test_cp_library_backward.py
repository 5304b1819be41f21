"""Ring attention's backward through FA2, FA3 and FFA's own backward calls, every mask.

Each ring step calls the library's private backward with the merged (out, lse) — the call
ring-flash-attn and MagiAttention make — here on stand-ins built from the upstream tables
(`tests/helpers/standin_rows.py`: FlashAttention's backward algorithm, not lcab's). The
distributed out, dq, dk, dv must equal the single-process fp64 reference and the measured bytes
the analytic ones (`tests.distributed.grid`). A mask whose blocks a kernel cannot take is
refused before anything runs, with the block named: those are listed, never run.
"""

from __future__ import annotations

import pytest
import torch

from lcab.cp import STRATEGIES
from lcab.kernels import Problem, get_kernel
from lcab.masks import list_masks, make_mask
from tests.distributed.grid import Case, run_grid
from tests.distributed.test_cp_grid import SEQLEN, mask_params
from tests.helpers.standin_ranks import rank_main_with_standins

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1200)]

KERNELS = ("fa2", "fa3", "ffa")
HEADS = (24, 6)
HEAD_DIM = 8  # FA3 takes multiples of 8 only


def admitted(case: Case, world: int, seed: int) -> str | None:
    """None when the strategy admits the case's mask with its kernel; else the reason.

    ``seed``: the one `tests.distributed.grid.rank_main` builds the mask with (the case's
    index in the list it runs), so the mask checked is the mask that runs.
    """
    strategy = STRATEGIES.get(case.strategy)(dict(case.options), 2)
    mask = make_mask(case.mask, case.seqlen, seed=seed, **dict(case.mask_params))
    problem = Problem(
        case.seqlen, case.seqlen, case.heads_q, case.heads_kv, case.head_dim, torch.float64
    )
    kernel = get_kernel(case.kernel)
    reasons = strategy.kernel_reasons(kernel, problem, "bwd")
    if mask.num_heads > 1 and not kernel.caps.per_head_masks:
        reasons.append("per-KV-head mask")
    elif mask.num_heads == 1:
        reasons += strategy.block_reasons(kernel, mask, problem, world)
    return "; ".join(reasons) or None


def cases(
    world: int,
    strategy: str,
    options: dict,
    masks: list[str],
    kernels: tuple[str, ...] = KERNELS,
    head_dim: int = HEAD_DIM,
) -> list[Case]:
    opts = tuple(sorted({**options, "balance": "zigzag"}.items()))
    return [
        Case(strategy, opts, m, mask_params(m, HEADS[1]), SEQLEN, *HEADS, kernel, head_dim)
        for kernel in kernels
        for m in masks
    ]


def run(
    world: int, grid: list[Case], tmp_path, rank_fn=rank_main_with_standins, case_timeout=60.0
) -> tuple[list[str], list[str]]:
    """(labels run and matching the reference, labels refused with their reason)."""
    refused: dict[Case, str | None] = {}
    runnable: list[Case] = []
    for case in grid:  # the index a case runs at is its mask's seed
        refused[case] = admitted(case, world, seed=len(runnable))
        if refused[case] is None:
            runnable.append(case)
    outcomes = run_grid(world, runnable, tmp_path, case_timeout, rank_fn)
    assert len(outcomes) == len(runnable)
    bad = [o for o in outcomes if o.status != "ok"]
    assert not bad, "\n".join(f"{o.case.label()}: {o.status} {o.detail} {o.errors}" for o in bad)
    skipped = [f"{c.label()}: {why}" for c, why in refused.items() if why is not None]
    return [o.case.label() for o in outcomes], skipped


@pytest.mark.parametrize("world", [2, 4])
def test_ring_backward_through_library_calls_every_mask(world, tmp_path) -> None:
    ok, refused = run(world, cases(world, "ring", {}, list_masks()), tmp_path)
    # every kernel runs the masks it must (FFA takes every one-head mask's blocks)
    assert sum(label.endswith(" ffa") for label in ok) == len(
        [
            m
            for m in list_masks()
            if make_mask(m, SEQLEN, seed=0, **dict(mask_params(m, 6))).num_heads == 1
        ]
    )
    for kernel in ("fa2", "fa3"):
        assert any(label.endswith(f" {kernel}") and " causal " in label for label in ok), refused
    print(f"world {world}: {len(ok)} run, {len(refused)} refused:", *refused, sep="\n  ")


def test_usp_and_loongtrain_backward_through_library_calls(tmp_path) -> None:
    masks = ["causal", "causal_document", "full_document", "sliding_window"]
    grid = cases(4, "usp", {"ulysses_degree": 2}, masks) + cases(
        4, "loongtrain", {"ulysses_degree": 1}, masks
    )
    ok, refused = run(4, grid, tmp_path)
    assert any(" ffa" in label and "loongtrain" in label for label in ok)
    print(f"{len(ok)} run, {len(refused)} refused:", *refused, sep="\n  ")
