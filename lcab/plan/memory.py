"""Attention memory per rank under a plan: activations and the strategy's buffers.

Counted: the rank's sequence shard of q, k, v, out and dout; the head-sharded copies a Ulysses
group holds; the K/V blocks a ring keeps in flight (the block in hand, the one arriving, and
LoongTrain's prefetched window block); the float32 accumulators of merged outputs and travelling
dK/dV; the full K/V an all-gather materialises and its gradients. Not counted: the rest of the
model and kernel workspaces (a few MiB), so this is the attention layer's own share.
"""

from __future__ import annotations

from lcab.cp.base import Plan, accumulator_bytes, element_bytes
from lcab.kernels import Problem

MIB = 1 << 20


def memory_terms(plan: Plan, problem: Problem, backward: bool) -> dict[str, float]:
    """MiB per rank of each term (see module docstring)."""
    elem, acc = element_bytes(problem), accumulator_bytes(problem)
    n, d, h = plan.shard_len, problem.head_dim, plan.heads
    q_shard = n * problem.heads_q * d
    kv_shard = n * problem.heads_kv * d
    terms = {"q, out": 2 * q_shard * elem, "k, v": 2 * kv_shard * elem}
    if backward:
        terms["dout, dq, dk, dv"] = (2 * q_shard + 2 * kv_shard) * elem
    group_tokens = n * plan.ulysses
    if plan.strategy == "ring_allgather":
        gathered = 2 * plan.ring * kv_shard * elem
        terms["gathered k, v"] = gathered
        if backward:
            terms["gathered dk, dv"] = gathered
    else:
        if plan.ulysses > 1:
            terms["head-sharded q, k, v, out"] = (
                group_tokens * (2 * h.local_q + 2 * h.local_kv) * d * elem
            )
        if plan.strategy != "ulysses":
            block = 2 * group_tokens * h.local_kv * d
            in_flight = 2 + (1 if plan.windows > 1 else 0)
            terms["k, v blocks in flight"] = in_flight * block * elem
            terms["merged out, lse (fp32)"] = group_tokens * h.local_q * (d + 1) * acc
            if backward:
                terms["travelling dk, dv (fp32)"] = 2 * block * acc
                terms["dq accumulator (fp32)"] = group_tokens * h.local_q * d * acc
    return {k: v / MIB for k, v in terms.items()}


def memory_mib(plan: Plan, problem: Problem, backward: bool = True) -> float:
    """Total MiB per rank (`memory_terms` summed)."""
    return float(sum(memory_terms(plan, problem, backward).values()))
