"""Under CP every kernel call is checked as the kernel itself would check it (the H100 run's CP
step found three kinds of cells that ran when the kernel's own checks refuse them).

Each case is judged by the kernel's own `not_supported_reasons` on the block a rank calls it
with, or on the heads the Ulysses split leaves it; this machine's circumstances (no CUDA, a
package missing) are left out, as the support matrix does.
"""

from __future__ import annotations

import pytest
import torch

from lcab.cp.base import STRATEGIES
from lcab.kernels import Problem, get_kernel
from lcab.masks import make_mask

CUDA = torch.device("cuda")


def refusals(strategy: str, kernel_name: str, mask, problem: Problem, world: int) -> list[str]:
    kernel = get_kernel(kernel_name)
    machine = {f"kernel {kernel.name}: {r}" for r in kernel.environment_reasons(problem.device)}
    instance = STRATEGIES.get(strategy)({}, world)
    reasons = instance.not_supported_reasons(kernel, problem, mask, world, "fwd")
    return [r for r in reasons if r not in machine and "needs a CUDA GPU" not in r]


def test_sdpa_flash_takes_a_whole_causal_mask_but_no_rectangle_of_it() -> None:
    problem = Problem(1024, 1024, 8, 8, 64, torch.bfloat16, CUDA)
    causal = make_mask("causal", 1024)
    # Ulysses: each rank calls the kernel on the whole sequence (is_causal)
    assert refusals("ulysses", "sdpa_flash", causal, problem, 2) == []
    # the all-gather calls it with a shard's rows against every key: not is_causal any more
    why = refusals("ring_allgather", "sdpa_flash", causal, problem, 2)
    assert why and "takes no attn_mask" in why[0], why
    # the kernel itself refuses such a block, which is what the strategy reports
    block = causal.restrict((0, 512), (0, 1024))
    assert get_kernel("sdpa_flash").not_supported_reasons(problem, block)


@pytest.mark.parametrize("strategy", ["ulysses", "ring_allgather"])
def test_a_kernel_without_gqa_is_refused_gqa_that_stays_gqa_on_a_rank(strategy) -> None:
    causal = make_mask("causal", 1024)
    gqa = Problem(1024, 1024, 8, 2, 64, torch.bfloat16, CUDA)  # 4:1 on each of 2 ranks
    why = refusals(strategy, "sdpa_efficient", causal, gqa, 2)
    assert any("no GQA" in r for r in why), why
    mha = Problem(1024, 1024, 8, 8, 64, torch.bfloat16, CUDA)
    assert not any("no GQA" in r for r in refusals(strategy, "sdpa_efficient", causal, mha, 2))


def test_replicated_kv_heads_that_make_mha_are_not_refused_gqa() -> None:
    # 4:2 heads over a Ulysses degree of 4: one query head and one (replicated) K/V head each
    problem = Problem(1024, 1024, 4, 2, 64, torch.bfloat16, CUDA)
    why = refusals("ulysses", "sdpa_efficient", make_mask("causal", 1024), problem, 4)
    assert not any("no GQA" in r for r in why), why


@pytest.mark.parametrize("strategy", ["ulysses", "ring", "ring_allgather"])
def test_a_whole_tile_kernel_is_refused_masks_with_partial_tiles_in_its_blocks(strategy) -> None:
    problem = Problem(1024, 1024, 8, 8, 64, torch.bfloat16, CUDA)
    why = refusals(strategy, "sparse_flex", make_mask("causal", 1024), problem, 2)
    assert any("partly attended" in r for r in why), why


def test_a_whole_tile_kernel_takes_full_tiles_that_blocks_keep_whole() -> None:
    problem = Problem(1024, 1024, 8, 8, 64, torch.bfloat16, CUDA)
    # contiguous shards of 512 tokens keep every 128x128 tile of the full mask whole
    assert refusals("ulysses", "sparse_flex", make_mask("full", 1024), problem, 2) == []
