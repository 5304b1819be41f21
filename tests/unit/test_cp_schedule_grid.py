"""Every strategy's schedule holds at 8 to 96 ranks, and the planner's replay is held to it.

For every registered strategy x the grid's masks x every world of 1 to 12 nodes of 8 (and
uneven grids the launcher allows: 3 x 8, 5 x 8, 3 x 4), forward and backward: every rank's
real code is recorded (`lcab.cp.schedule_check`) and must keep every cross-rank rule
(`lcab.cp.schedule_rules`: groups, collectives, paired sends, no deadlock, the plan's bytes).
Then the planner's replay of the same plan (`lcab.plan.replay`) must move, for every rank, pass
and operation, the same transfers in the same order as the recording: their bytes, whether they
leave the node (the replay keeps the node of a peer, not the peer) and whether a kernel call
runs while they are in flight. The replay prices an operation's back-to-back blocking
collectives as one (K and V's two all-gathers, q/k/v's three all-to-alls), so both sides are
compared with those merged.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from lcab.cp import STRATEGIES
from lcab.cp.schedule import COLLECTIVES, RankSchedule
from lcab.cp.schedule_check import GRID_MASKS, GRID_WORLDS, grid_case, record
from lcab.cp.schedule_rules import check
from lcab.plan.replay import Replay, replay

UNEVEN = [(24, 8), (40, 8), (12, 4)]
WORLDS = [(world, 8) for world in GRID_WORLDS] + UNEVEN


def _merged(transfers: list[tuple]) -> dict[str, list[tuple]]:
    """Per operation, its transfers in order; back-to-back blocking collectives as one."""
    out: list[tuple] = []
    for op, kind, nbytes, far, overlapped in transfers:
        last = out[-1] if out else None
        if last and kind != "p2p" and not overlapped and last[:2] == (op, kind) and not last[4]:
            out[-1] = (op, kind, last[2] + nbytes, last[3] or far, False)
        else:
            out.append((op, kind, nbytes, far, overlapped))
    by_op = defaultdict(list)
    for op, *rest in out:
        by_op[op].append(tuple(rest))
    return dict(by_op)


def recorded(log: RankSchedule, pass_: str, per_node: int) -> dict[str, list[tuple]]:
    """A rank's transfers of one pass: overlapped when a kernel call ran between post and wait."""
    events = [e for e in log.events if e.pass_ == pass_]
    transfers = []
    for i, e in enumerate(events):
        if e.kind == "post":
            end = next(j for j, w in enumerate(events) if w.kind == "wait" and w.handle == e.handle)
            overlapped = any(x.kind == "call" for x in events[i:end])
            far = e.peer // per_node != log.rank // per_node
            transfers.append((e.op, "p2p", e.sent, far, overlapped))
        elif e.kind in COLLECTIVES:
            far = len({rank // per_node for rank in e.group}) > 1
            transfers.append((e.op, e.kind, e.sent, far, False))
    return _merged(transfers)


def replayed(plan_replay: Replay, rank: int, pass_: str) -> dict[str, list[tuple]]:
    """The replay's transfers of ``rank`` in ``pass_``: a stage's ``during`` overlaps its call,
    a window's ``background`` any call of the window, an ``after`` nothing."""
    transfers = []
    for window in plan_replay.passes[pass_][rank]:
        calls = [bool(s.work and s.work.flops) for s in window.stages]
        transfers += [
            (t.op, t.kind, t.nbytes, t.inter_bytes > 0, any(calls)) for t in window.background
        ]
        for stage, call in zip(window.stages, calls, strict=True):
            transfers += [(t.op, t.kind, t.nbytes, t.inter_bytes > 0, call) for t in stage.during]
            transfers += [(t.op, t.kind, t.nbytes, t.inter_bytes > 0, False) for t in stage.after]
    return _merged(transfers)


@pytest.mark.parametrize(("world", "per_node"), WORLDS)
@pytest.mark.parametrize("name", STRATEGIES.names())
def test_every_rank_keeps_the_schedule_and_the_replay_moves_what_it_records(name, world, per_node):
    for mask_name in GRID_MASKS:
        strategy, mask, problem = grid_case(name, mask_name, world, per_node)
        plan = strategy.plan(mask, problem, world)
        logs = record(strategy, mask, problem, world, plan)
        report = check(logs, plan)
        assert report.problems == (), (mask_name, report.problems[:3])
        assert report.ranks == world and report.operations > 0
        priced = replay(strategy, mask, problem, world, plan)
        for log in logs:
            for pass_ in ("fwd", "bwd"):
                want = recorded(log, pass_, per_node)
                assert replayed(priced, log.rank, pass_) == want, (mask_name, log.rank, pass_)
