"""What makes the planner fast at 96 ranks gives what the plain definitions give.

`CallWorks` (the memoised call of a replay) is compared with `call_work` (the plain definition)
on every pair, one-head and per-KV-head masks alike; a 96-rank replay is checked to share its
calls and stages (what lets the cost model cost each once); `Strategy.block_reasons` is checked
to check a mask's blocks once for both passes, and again for another mask.
"""

from __future__ import annotations

import torch

from lcab.cp import STRATEGIES
from lcab.kernels import Problem, get_kernel
from lcab.masks import make_mask
from lcab.masks.core import AttnMask
from lcab.plan.areas import pair_work
from lcab.plan.calls import Call, CallWorks, figures_of, work_of
from lcab.plan.harness import LCAB, LONGCA
from lcab.plan.replay import replay


def call_work(works, plan, problem, ui, i, j, bwd, call):
    """The call of Ulysses member ``ui`` on pair (i, j), unmemoised: its KV heads' figures."""
    mask_heads = [0] if works.area.shape[0] == 1 else plan.heads.kv_heads_of(ui)
    figures = figures_of(works, mask_heads, plan.heads.local_q, i, j)
    if figures[0] <= 0:
        return None
    harness = call.harness
    copies = harness.call_passes(call.family, bwd).plus(harness.half_passes(call.half, bwd))
    return work_of(figures, plan, problem, bwd, call, copies)


def test_memoised_calls_are_the_plain_definition_on_every_pair() -> None:
    for mask, cp, world in (
        (make_mask("causal_document", 4096, seed=3), "ring", 8),
        (make_mask("block_sparse", 2048, seed=5, block_size=32, heads=4), "usp", 8),
    ):
        problem = Problem(mask.seqlen_q, mask.seqlen_q, 8, 4, 64, torch.bfloat16)
        strategy = STRATEGIES.get(cp)({"ulysses_degree": 2} if cp == "usp" else {}, 4)
        plan = strategy.plan(mask, problem, world)
        shards = list(plan.placement.layouts)
        works = pair_work(mask, shards, shards)
        memo = CallWorks(works, plan, problem)
        checked = 0
        for harness in (LCAB, LONGCA):
            call = Call("ring", harness, plan.shard_len, plan.shard_len, 3, half="kv")
            for ui in range(plan.ulysses):
                for i in range(len(shards)):
                    for j in range(len(shards)):
                        for bwd in (False, True):
                            want = call_work(works, plan, problem, ui, i, j, bwd, call)
                            assert memo(ui, i, j, bwd, call) == want, (cp, ui, i, j, bwd)
                            checked += want is not None
        assert checked > 0


def test_a_96_rank_ring_shares_its_calls_and_stages() -> None:
    mask = make_mask("causal", 96 * 256)
    problem = Problem(mask.seqlen_q, mask.seqlen_q, 64, 8, 128, torch.bfloat16)
    strategy = STRATEGIES.get("ring")({}, 8)
    replayed = replay(strategy, mask, problem, 96)
    for pass_ in ("fwd", "bwd"):
        stages = [s for rank in replayed.passes[pass_] for w in rank for s in w.stages]
        works = [s.work for s in stages if s.work is not None]
        assert len(stages) >= 96 * 96
        # equal calls are one object (the cost model costs each object once) ...
        assert len({id(w) for w in works}) == len(set(works)), pass_
        assert len({id(s) for s in stages}) == len(set(stages)), pass_
        # ... and zigzag on a causal mask has few kinds of step, not 96 x 96
        assert len(set(works)) <= 8 and len(set(stages)) <= 40, pass_


class _Counting:
    """A varlen kernel that counts the blocks it is asked about."""

    def __init__(self) -> None:
        self.kernel = get_kernel("fa3")
        self.asked = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.kernel, name)

    def mask_refusals(self, problem: Problem, mask: AttnMask) -> list[str]:
        self.asked += 1
        return list(self.kernel.mask_refusals(problem, mask))


def test_block_reasons_checks_the_blocks_of_one_mask_once() -> None:
    strategy = STRATEGIES.get("ring")({}, 4)
    kernel = _Counting()
    problem = Problem(2048, 2048, 8, 4, 64, torch.bfloat16, torch.device("cuda"))
    mask = make_mask("causal_document", 2048, seed=1)
    first = strategy.block_reasons(kernel, mask, problem, 8)  # type: ignore[arg-type]
    asked = kernel.asked
    assert asked > 1  # a varlen kernel: every non-empty block
    again = strategy.block_reasons(kernel, mask, problem, 8)  # type: ignore[arg-type]
    assert (again, kernel.asked) == (first, asked)
    other = make_mask("causal_document", 2048, seed=2)
    strategy.block_reasons(kernel, other, problem, 8)  # type: ignore[arg-type]
    assert kernel.asked > asked
    fresh = STRATEGIES.get("ring")({}, 4)
    assert fresh.block_reasons(kernel, other, problem, 8) == strategy.block_reasons(  # type: ignore[arg-type]
        kernel,  # type: ignore[arg-type]
        other,
        problem,
        8,
    )
