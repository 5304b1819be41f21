"""The schedule check catches each defect that would hang or mislead a large job.

Defects are planted in the runner's own code paths (a rank's exchange, a rank's group creation,
a rank's input shard), never in the records: the check must find them from what the ranks
issue, and name the rank, pass, step and operation. The deadlock rule is also tested on
hand-built records whose outcome is worked out by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import lcab.cp.ring_attention as ring_attention
import lcab.cp.schedule_check as schedule_check
from lcab.cp import STRATEGIES
from lcab.cp.comm import PendingExchange
from lcab.cp.schedule import Event, RankSchedule
from lcab.cp.schedule_rules import check
from lcab.distributed.groups import Grid


def test_a_rank_that_skips_an_exchange_is_named_with_its_step_and_operation(monkeypatch):
    real = ring_attention.exchange

    def skipping(send, dst, src, group, op="p2p"):
        log = group.log
        if log.rank == 5 and log.pass_ == "bwd" and op == "ring_dkv" and log.step == 3:
            return PendingExchange([], [t.clone() for t in send])  # neither sent nor received
        return real(send, dst, src, group, op)

    monkeypatch.setattr(ring_attention, "exchange", skipping)
    problems = schedule_check.grid_cell("ring", "causal", 16).problems
    # rank 5's neighbours send and wait for what it never posts, at the step it skipped
    assert problems[0].startswith("rank 5 misses a receive: rank 4 bwd step 3 ring_dkv sends it")
    assert problems[1].startswith(
        "rank 5 misses a send: rank 6 bwd step 3 ring_dkv waits to receive"
    )
    # dK and dV of 8 tokens x 1 K/V head x head dim 2 in fp32 make 128 bytes a hop, 16 hops
    assert problems[2] == "rank 5 sends other bytes than its plan: ring_dkv 1,920 (plan 2,048)"


def test_a_rank_that_creates_its_groups_in_another_order_is_named(monkeypatch):
    real = Grid.create_groups

    def reordered(self, dist):
        if self.rank == 13:  # rings first, then the Ulysses groups
            for ring in self.rings():
                dist.group(ring)
        return real(self, dist)

    monkeypatch.setattr(Grid, "create_groups", reordered)
    (problem,) = schedule_check.grid_cell("usp", "causal", 32).problems
    assert problem.startswith(
        "rank 13 build new_group #1: creates group of ranks 0, 8, ..., 24 (4) where rank 0 "
        "creates group of ranks 0..7"
    )


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_a_rank_whose_block_is_a_token_short_is_named(name, monkeypatch):
    real = schedule_check._inputs

    def short(plan, problem, rank):
        tensors = real(plan, problem, rank)
        return [t[:-1].detach().requires_grad_() for t in tensors] if rank == 7 else tensors

    monkeypatch.setattr(schedule_check, "_inputs", short)
    problems = schedule_check.grid_cell(name, "causal", 16).problems
    first = [p for p in problems if "rank 7" in p and "fwd step 0" in p]
    assert first, problems
    # the operation of the event named, and the plan's bytes missed by rank 7
    op = first[0].split("fwd step 0 ")[1].split()[0]
    assert op in STRATEGIES.get(name)({}, 8).plan(*_small(name)).comm_bytes
    assert any(p.startswith("rank 7 sends other bytes than its plan") for p in problems)


def _small(name):
    from lcab.kernels import Problem
    from lcab.masks import make_mask

    u = STRATEGIES.get(name)({}, 8).ulysses_degree(16)
    return make_mask("causal", 128), Problem(128, 128, 2 * u, max(u // 2, 1), 2), 16


def _post(log, op, gid, peer):
    """An exchange with ``peer`` (a send to it, a receive from it) on group ``gid`` of 0, 1."""
    handle = len(log.events)
    log.events.append(
        Event("post", "fwd", 0, op, (0, 1), "", gid, peer, peer, (4,), 4, "f", handle)
    )
    log.events.append(Event("wait", "fwd", 0, op, handle=handle))


def _collective(log, op, gid):
    log.events.append(Event("a2a", "fwd", 0, op, (0, 1), "", gid, sizes=(8,), sent=4))


def _plan(comm_bytes):
    return SimpleNamespace(comm_bytes=comm_bytes)


def test_collectives_entered_in_opposite_orders_deadlock_in_a_cycle():
    """Ranks 0 and 1 share groups 0 and 1; each group sees the same collectives from both, but
    rank 0 enters group 0 first and rank 1 group 1 first: each waits for the other."""
    zero, one = RankSchedule(0), RankSchedule(1)
    _collective(zero, "x", 0)
    _collective(zero, "y", 1)
    _collective(one, "y", 1)
    _collective(one, "x", 0)
    assert check([zero, one], _plan({"x": 4, "y": 4})).problems == (
        "deadlock: rank 0 fwd step 0 x waits for rank 1, rank 1 fwd step 0 y waits for rank 0: "
        "a cycle",
    )
    one.events.reverse()  # the same order on both ranks: no problem
    assert check([zero, one], _plan({"x": 4, "y": 4})).problems == ()


def test_exchanges_waited_in_opposite_orders_deadlock_though_every_message_pairs():
    """Each rank exchanges with the other on groups 0 and 1, every send paired with a receive;
    rank 0 waits on group 0's exchange before posting group 1's, rank 1 the other way round."""
    zero, one = RankSchedule(0), RankSchedule(1)
    _post(zero, "a", 0, 1)
    _post(zero, "b", 1, 1)
    _post(one, "b", 1, 0)
    _post(one, "a", 0, 0)
    assert check([zero, one], _plan({"a": 4, "b": 4})).problems == (
        "deadlock: rank 0 fwd step 0 a waits for rank 1, rank 1 fwd step 0 b waits for rank 0: "
        "a cycle",
    )
