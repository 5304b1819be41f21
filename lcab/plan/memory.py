"""Memory per rank under a plan: the attention tensors, the strategy's buffers, the kernel's own.

From the plan: the rank's shards of q, k, v, out (and gradients) and the strategy's own
buffers (`Strategy.buffers`). From the profile (`lcab.plan.hardware.KernelMemory`, fitted to
measured frontiers): what the kernel and lcab's harness hold besides, and for a dense-mask
kernel the biases its prepared calls keep (`rank_extras`); on CUDA lcab's 256 MiB L2-flush
buffer. The terms: the plan guide's "The memory frontier". Not counted: the rest of a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lcab.cp.base import STRATEGIES, Plan, element_bytes
from lcab.kernels import Problem
from lcab.masks.core import AttnMask
from lcab.plan.hardware import KernelMemory

MIB = 1 << 20
L2_FLUSH_MIB = 256.0
"""lcab's L2-flush buffer on a CUDA device (`lcab.bench.timing.L2_FLUSH_BYTES`), alive while a
pass is timed and so inside a memory budget."""


@dataclass(frozen=True)
class RankExtras:
    """What the profile says a rank holds besides the tensors, and how much dense mask it keeps."""

    kernel: KernelMemory = field(default_factory=KernelMemory)
    dense_positions: tuple[float, float] = (0.0, 0.0)
    """Positions of the dense masks the rank's prepared calls keep, all and the largest call's
    (`dense_positions`)."""
    flush_l2: bool = False
    """A CUDA cell timed with lcab's L2 flush (``bench.flush_l2``)."""


def memory_terms(
    plan: Plan, problem: Problem, backward: bool, extras: RankExtras | None = None
) -> dict[str, float]:
    """MiB per rank of each term (see module docstring)."""
    elem = element_bytes(problem)
    n, d = plan.shard_len, problem.head_dim
    q_shard = n * problem.heads_q * d
    kv_shard = n * problem.heads_kv * d
    terms: dict[str, float] = {"q, out": 2 * q_shard * elem, "k, v": 2 * kv_shard * elem}
    if backward:
        terms["dout, dq, dk, dv"] = (2 * q_shard + 2 * kv_shard) * elem
    terms |= STRATEGIES.get(plan.strategy).buffers(plan, problem, backward)
    mib = {k: v / MIB for k, v in terms.items()}
    call_q = n * plan.ulysses * plan.heads.local_q * d
    return mib | _extra_terms(extras or RankExtras(), call_q, elem, cp=True)


def single_device_terms(
    problem: Problem, backward: bool, extras: RankExtras | None = None
) -> dict[str, float]:
    """MiB of each term of one device holding the whole problem (``cp=none``)."""
    elem = element_bytes(problem)
    q = problem.seqlen_q * problem.heads_q * problem.head_dim
    kv = problem.seqlen_k * problem.heads_kv * problem.head_dim
    terms = {"q, out": 2 * q * elem / MIB, "k, v": 2 * kv * elem / MIB}
    if backward:
        terms["dout, dq, dk, dv"] = (2 * q + 2 * kv) * elem / MIB
    return terms | _extra_terms(extras or RankExtras(), q, elem, cp=False)


def _extra_terms(
    extras: RankExtras, call_q_elements: float, elem: int, cp: bool
) -> dict[str, float]:
    """The profile's terms of a rank whose largest call has ``call_q_elements`` query elements."""
    kernel, terms = extras.kernel, {}
    fixed = kernel.fixed_mib
    if cp and kernel.cp_fixed_mib is not None:
        fixed = kernel.cp_fixed_mib
    if fixed:
        terms["kernel and harness, fixed"] = fixed
    per_element = kernel.q_bytes
    if cp and kernel.cp_q_bytes is not None:
        per_element = kernel.cp_q_bytes
    if per_element:
        terms["kernel and harness, per token"] = per_element * call_q_elements / MIB
    held, largest = extras.dense_positions
    if kernel.dense_bytes and held:
        terms["dense mask biases"] = held * elem / MIB
        terms["largest dense call"] = kernel.dense_bytes * largest / MIB
    if extras.flush_l2:
        terms["lcab's L2 flush buffer"] = L2_FLUSH_MIB
    return terms


def whole_dense_positions(mask: AttnMask, problem: Problem) -> tuple[float, float]:
    """Bias positions a dense-mask kernel keeps for ``mask`` on one device: all, the largest.

    One call, so both the same; 0 where it needs none.
    """
    from lcab.kernels.sdpa import whole_mask_kind

    if whole_mask_kind(mask) is not None:
        return 0.0, 0.0
    held = float(mask.seqlen_q * mask.seqlen_k * (problem.heads_q if mask.num_heads > 1 else 1))
    return held, held


def dense_positions(plan: Plan, mask: AttnMask) -> tuple[float, float]:
    """The dense-bias positions of the fullest rank's prepared calls: all, and its largest.

    A call whose sub-mask (the strategy's own, `lcab.cp.base.step_mask`) is not one full or
    causal slice over a square keeps a dense bias of its rectangle while the cell runs, so a
    rank holds the sum over its prepared calls (a zigzag diagonal step holds one too).
    """
    from lcab.cp.base import step_mask
    from lcab.kernels.sdpa import whole_mask_kind

    def held(rows: np.ndarray, cols: np.ndarray) -> int:
        sub = step_mask(mask, rows, cols, None)
        if not sub.num_slices or whole_mask_kind(sub) is not None:
            return 0
        return len(rows) * len(cols)

    by_rows: dict[int, list[int]] = {}  # a rank's calls share its rows
    for rows, cols in STRATEGIES.get(plan.strategy).blocks(plan, mask):
        by_rows.setdefault(id(rows), []).append(held(rows, cols))
    calls = list(by_rows.values())
    fullest = max(calls, key=sum)
    return float(sum(fullest)), float(max(fullest))


def takes_dense_mask(kernel: str) -> bool:
    """Whether kernel ``kernel`` gets its mask as a dense bias (its caps' ``dense`` lowering)."""
    from lcab.kernels.registry import KERNELS

    try:
        return KERNELS.get(kernel).caps.lowering == "dense"
    except ValueError:  # not registered: no dense mask is counted
        return False


def rank_extras(
    kernel: str,
    memory: KernelMemory,
    mask: AttnMask,
    problem: Problem,
    plan: Plan | None = None,
    flush_l2: bool = False,
) -> RankExtras:
    """What ``memory`` (the profile's terms for ``kernel``) adds to a rank running ``mask``.

    The dense masks are counted only for a kernel that takes one and has a term for them:
    on one device (``plan=None``) the whole mask's, else those of the plan's prepared calls.
    """
    dense = (0.0, 0.0)
    if memory.dense_bytes and takes_dense_mask(kernel):
        dense = (
            whole_dense_positions(mask, problem) if plan is None else dense_positions(plan, mask)
        )
    return RankExtras(memory, dense, flush_l2)
