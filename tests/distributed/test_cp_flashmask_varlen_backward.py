"""Ring attention's backward through FlashMask's and torch varlen's own backward ops, every mask.

Each ring step of lcab's real CP runtime (gloo, 2 and 4 ranks) calls the kernel's backward
from merged statistics: FlashMask's ``flashmask_cuda.bwd`` and torch's
``torch_attn::_varlen_attn_backward``, here on stand-ins built from the upstream tables
(``tests/helpers/standin_flashmask.py``, ``tests/helpers/standin_torch_varlen.py``) and the
libraries' real source. The distributed out, dq, dk, dv must equal the single-process fp64
reference (`tests.distributed.grid`). A mask whose blocks a kernel cannot take is refused before
anything runs, with the reason: those are listed, never run.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from lcab.cp import STRATEGIES
from lcab.kernels import Problem, get_kernel
from lcab.masks import list_masks, make_mask
from tests.distributed.grid import Case, run_grid
from tests.distributed.test_cp_grid import SEQLEN, mask_params

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1200)]

KERNELS = ("flashmask", "torch_varlen")
HEADS = (24, 6)
HEAD_DIM = 8  # FlashMask takes multiples of 8 only


def rank_with_standins(rank: int, world: int, rendezvous: str, messages: Any, cases: list) -> None:
    """`tests.distributed.grid.rank_main` with FlashMask's and torch varlen's stand-ins."""
    from lcab.kernels import torch_varlen
    from lcab.kernels.upstream.flashmask import MODULE
    from tests.distributed.grid import rank_main
    from tests.helpers import standin_flashmask, standin_torch_varlen

    sys.modules[MODULE] = standin_flashmask.flashmask_module()
    sys.modules[torch_varlen.MODULE] = standin_torch_varlen.varlen_module()  # type: ignore[assignment]
    rank_main(rank, world, rendezvous, messages, cases)


def admitted(case: Case, world: int, seed: int) -> str | None:
    """None when the strategy admits the case (its reasons less the device's and package's);
    ``seed`` is the mask's, which `tests.distributed.grid.rank_main` takes from the position."""
    strategy = STRATEGIES.get(case.strategy)(dict(case.options), 2)
    mask = make_mask(case.mask, case.seqlen, seed=seed, **dict(case.mask_params))
    problem = Problem(case.seqlen, case.seqlen, case.heads_q, case.heads_kv, case.head_dim,
                      torch.bfloat16, torch.device("cuda"))  # fmt: skip
    reasons = strategy.not_supported_reasons(get_kernel(case.kernel), problem, mask, world, "bwd")
    ours = [r for r in reasons if "CUDA" not in r and "package" not in r]
    return "; ".join(ours) or None


def run(world: int, grid: list[Case], tmp_path) -> tuple[list[str], list[str]]:
    """(labels run and matching the reference, labels refused with their reason)."""
    refused: dict[Case, str | None] = {}
    runnable: list[Case] = []
    for case in grid:  # a case's mask seed is its index among the cases that run
        refused[case] = admitted(case, world, seed=len(runnable))
        if refused[case] is None:
            runnable.append(case)
    outcomes = run_grid(world, runnable, tmp_path, rank_fn=rank_with_standins)
    assert len(outcomes) == len(runnable)
    bad = [o for o in outcomes if o.status != "ok"]
    assert not bad, "\n".join(f"{o.case.label()}: {o.status} {o.detail} {o.errors}" for o in bad)
    skipped = [f"{c.label()}: {why}" for c, why in refused.items() if why is not None]
    return [o.case.label() for o in outcomes], skipped


def cases(strategy: str, options: dict, masks: list[str]) -> list[Case]:
    opts = tuple(sorted({**options, "balance": "zigzag"}.items()))
    return [
        Case(strategy, opts, m, mask_params(m, HEADS[1]), SEQLEN, *HEADS, kernel, HEAD_DIM)
        for kernel in KERNELS
        for m in masks
    ]


@pytest.mark.parametrize("world", [2, 4])
def test_ring_backward_through_flashmask_and_varlen_ops_every_mask(world, tmp_path) -> None:
    ok, skipped = run(world, cases("ring", {}, list_masks()), tmp_path)
    print(f"world {world}: {len(ok)} run, {len(skipped)} refused:", *skipped, sep="\n  ")
    # each runs the masks its blocks allow: FlashMask the causal and document ones; torch's
    # varlen_attn a document mask and a causal window (blocks of equal lengths). On 101 tokens
    # zigzag's diagonal blocks give causal sequences of unequal lengths, whose alignment torch
    # does not document: refused by the adapter's own check, as for a single call.
    runs = {"flashmask": ("causal", "causal_document"),
            "torch_varlen": ("full_document", "sliding_window_causal")}  # fmt: skip
    for kernel, masks in runs.items():
        for mask in masks:
            assert any(f" {mask} " in label and label.endswith(f" {kernel}") for label in ok), mask
    refused_causal = [r for r in skipped if " causal " in r and "torch_varlen" in r]
    assert refused_causal and "does not document causal/window alignment" in refused_causal[0]


def test_usp_and_loongtrain_backward_through_flashmask_and_varlen_ops(tmp_path) -> None:
    masks = ["causal", "causal_document", "full_document", "sliding_window"]
    grid = cases("usp", {"ulysses_degree": 2}, masks) + cases(
        "loongtrain", {"ulysses_degree": 1}, masks
    )
    ok, skipped = run(4, grid, tmp_path)
    print(f"{len(ok)} run, {len(skipped)} refused:", *skipped, sep="\n  ")
    for kernel in KERNELS:
        for strategy in ("usp", "loongtrain"):
            assert any(label.startswith(strategy) and label.endswith(f" {kernel}") for label in ok)
