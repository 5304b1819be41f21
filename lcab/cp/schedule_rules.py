"""The rules a schedule must keep across ranks, checked over every rank's recorded events.

`check` asks of every rank's `lcab.cp.schedule.RankSchedule` what a hang or a wrong result at
scale would need, and names the rank, pass, step (kernel calls before it) and operation of the
first event that breaks each rule:

* every rank creates the same process groups in the same order (``new_group`` is collective);
* the members of each group issue the same collectives, with the same sizes, in the same order;
* every tensor a rank sends has its receive at the peer, the same size, in the same order, on
  the same group;
* no rank waits for ever: the ranks are run to completion under NCCL's rules — a collective
  completes once every member has entered it, an exchange once its peers have posted the
  matching receives and sends — and a rank left waiting is traced along whom it waits for, to
  a cycle or to a rank that finished without what it waits for;
* the bytes each rank sends per operation equal the plan's analytic bytes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise, zip_longest
from typing import Any

from lcab.cp.plan import Plan
from lcab.cp.schedule import COLLECTIVES, Event, RankSchedule


@dataclass(frozen=True)
class ScheduleReport:
    """What a check saw, and what it found wrong (empty: the schedule holds)."""

    ranks: int
    operations: int
    """Communication calls over all ranks: exchanges posted and collectives."""
    bytes: int
    """Bytes sent over all ranks (forward and backward)."""
    problems: tuple[str, ...]

    def text(self) -> str:
        """``96 ranks, 27,360 operations, 52.4 MB: matches`` (or its first problem)."""
        seen = f"{self.ranks} ranks, {self.operations:,} operations, {self.bytes / 1e6:.3g} MB"
        return f"{seen}: " + (self.problems[0] if self.problems else "matches")


def check(logs: list[RankSchedule], plan: Plan) -> ScheduleReport:
    """Every rule of the module docstring over every rank's schedule (see `record`)."""
    problems = _group_order(logs) or _collectives(logs) + _pairing(logs)
    problems = problems or _deadlock(logs)
    problems += _bytes(logs, plan)
    moves = [e for log in logs for e in log.events if e.kind == "post" or e.kind in COLLECTIVES]
    return ScheduleReport(len(logs), len(moves), sum(e.sent for e in moves), tuple(problems))


def _ranks(ranks: tuple[int, ...]) -> str:
    """A group's ranks in few words: ``ranks 0..95``, ``ranks 3, 11, ..., 91 (12)``."""
    step = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    if len(ranks) > 3 and all(b - a == step for a, b in pairwise(ranks)):
        inner = ".." if step == 1 else f", {ranks[0] + step}, ..., "
        return f"ranks {ranks[0]}{inner}{ranks[-1]}" + ("" if step == 1 else f" ({len(ranks)})")
    return "ranks " + ", ".join(map(str, ranks))


def _group_name(tag: str, ranks: tuple[int, ...]) -> str:
    return f"group {tag + ' ' if tag else ''}of {_ranks(ranks)}"


def _group_order(logs: list[RankSchedule]) -> list[str]:
    """Every rank creates rank 0's groups in rank 0's order."""
    first = [(e.tag, e.group) for e in logs[0].events if e.kind == "group"]
    for log in logs[1:]:
        made = [(e.tag, e.group) for e in log.events if e.kind == "group"]
        for i, (mine, theirs) in enumerate(zip_longest(made, first)):
            if mine != theirs:
                said = f"creates {_group_name(*mine)}" if mine else "creates no more groups"
                return [
                    f"rank {log.rank} build new_group #{i + 1}: {said} where rank 0 creates "
                    f"{_group_name(*theirs) if theirs else 'none'} (every rank must create every "
                    "group, in the same order)"
                ]
    return []


def _collectives(logs: list[RankSchedule]) -> list[str]:
    """The members of each group issue the same collectives with the same sizes, in order."""
    issued: dict[int, dict[int, list[Event]]] = defaultdict(lambda: defaultdict(list))
    problems = []
    for log in logs:
        for e in log.events:
            if e.kind in COLLECTIVES:
                issued[e.group_id][log.rank].append(e)
                if log.rank not in e.group:
                    problems.append(f"{e.where(log.rank)}: issued on a group it is not in")
    for by_rank in issued.values():
        some = next(iter(by_rank.values()))[0]
        first = by_rank[some.group[0]]
        for rank in some.group[1:]:
            for i, (a, b) in enumerate(zip_longest(by_rank[rank], first)):
                if _what(a) != _what(b):
                    said = [
                        f"rank {r} issues no collective #{i + 1} there"
                        if e is None
                        else f"{e.where(r)} is its collective #{i + 1} there: {e.kind} of "
                        f"{e.sizes[0]:,} bytes {e.dtype}"
                        for r, e in ((rank, a), (some.group[0], b))
                    ]
                    problems.append(
                        f"{_group_name(some.tag, some.group)}: {said[0]}, but {said[1]}"
                    )
                    break
    return problems


def _what(e: Event | None) -> tuple[Any, ...] | None:
    """What members must agree on of a collective: its kind, sizes and dtype."""
    return None if e is None else (e.kind, e.sizes, e.dtype)


def _messages(
    logs: list[RankSchedule], detail: bool = True
) -> tuple[dict[Any, list[Any]], dict[Any, list[Any]]]:
    """Every tensor sent and every receive posted, by (group, sender, receiver), in order.

    Each as (size, event), or its size alone (``detail=False``: what the rule compares).
    """
    sends: dict[Any, list[Any]] = defaultdict(list)
    receives: dict[Any, list[Any]] = defaultdict(list)
    for log in logs:
        for e in log.events:
            if e.kind != "post":
                continue
            if not detail:
                sends[e.group_id, log.rank, e.peer].extend(e.sizes)
                receives[e.group_id, e.source, log.rank].extend(e.sizes)
                continue
            for size in e.sizes:
                sends[e.group_id, log.rank, e.peer].append((size, e))
                receives[e.group_id, e.source, log.rank].append((size, e))
    return sends, receives


def _pairing(logs: list[RankSchedule]) -> list[str]:
    """Every send has its receive at the peer, of its size, in the same order.

    Where one side has fewer messages, the first whose pass, operation or step differs between
    the sides is named (in lockstep, the one that went missing), else the first left over.
    """
    sends, receives = _messages(logs, detail=False)
    if sends == receives:
        return []
    sends, receives = _messages(logs)
    problems = []
    for key in sorted(set(sends) | set(receives)):
        _, src, dst = key
        out, into = sends.get(key, []), receives.get(key, [])
        e = (out or into)[0][1]
        where = _group_name(e.tag, e.group)
        if len(out) != len(into):
            pairs = zip(out, into, strict=False)
            i = next((i for i, (a, b) in enumerate(pairs) if a[1][1:3] != b[1][1:3]), None)
            i = min(len(out), len(into)) if i is None else i
            size, e = out[i] if len(out) > len(into) else into[i]
            counts = f"{min(len(out), len(into))} against {max(len(out), len(into))}"
            if len(out) > len(into):
                problems.append(
                    f"rank {dst} misses a receive: {e.where(src)} sends it message #{i + 1} on "
                    f"{where} ({size:,} bytes), which rank {dst} does not receive ({counts})"
                )
            else:
                problems.append(
                    f"rank {src} misses a send: {e.where(dst)} waits to receive message "
                    f"#{i + 1} from it on {where} ({size:,} bytes), which rank {src} does not "
                    f"send ({counts})"
                )
            continue
        for (a, ea), (b, eb) in zip(out, into, strict=True):
            if a != b:
                problems.append(
                    f"{ea.where(src)} sends {a:,} bytes to rank {dst} on {where}, where "
                    f"{eb.where(dst)} receives {b:,} bytes"
                )
                break
    return problems


def _bytes(logs: list[RankSchedule], plan: Plan) -> list[str]:
    """Each rank sends, per operation, the plan's analytic bytes."""
    want = {op: b for op, b in plan.comm_bytes.items() if b}
    problems = []
    for log in logs:
        sent: Counter[str] = Counter()
        for e in log.events:
            if e.kind == "post" or e.kind in COLLECTIVES:
                sent[e.op] += e.sent
        if dict(sent) != want:
            ops = sorted(op for op in set(sent) | set(want) if sent.get(op) != want.get(op))
            diff = [f"{op} {sent.get(op, 0):,} (plan {want.get(op, 0):,})" for op in ops]
            problems.append(f"rank {log.rank} sends other bytes than its plan: " + ", ".join(diff))
            break
    return problems


class _Run:
    """The ranks run under NCCL's rules, event by event (see the module docstring).

    Only what can block or let another rank go on is run: posts, waits and collectives.
    """

    def __init__(self, logs: list[RankSchedule]) -> None:
        moves = ("post", "wait", *COLLECTIVES)
        self.events = [[e for e in log.events if e.kind in moves] for log in logs]
        self.at = [0] * len(logs)
        self.posted: Counter[tuple[Any, ...]] = Counter()
        """Messages posted per (0: sent | 1: received, group id, sender, receiver)."""
        self.needs: dict[tuple[int, int], tuple[tuple[tuple[Any, ...], int], ...]] = {}
        """Per posted exchange, the counterparts' channels and the count each must reach."""
        self.entered: defaultdict[int, Counter[int]] = defaultdict(Counter)
        self.inside = [False] * len(logs)
        """Whether a rank has entered the collective it stands at."""

    def blocker(self, rank: int) -> int | None:
        """The rank that ``rank``'s current event waits for (None: it goes on)."""
        e = self.events[rank][self.at[rank]]
        if e.kind == "wait":
            for channel, count in self.needs[rank, e.handle]:
                if self.posted[channel] < count:
                    return int(channel[3] if channel[0] else channel[2])  # the receiver, sender
        elif e.kind in COLLECTIVES:
            entered = self.entered[e.group_id]
            late = [m for m in e.group if entered[m] < entered[rank]]
            return late[0] if late else None
        return None

    def step(self, rank: int) -> bool:
        """Run ``rank``'s current event if it can complete; whether it did."""
        e = self.events[rank][self.at[rank]]
        if e.kind == "post":
            n, posted = len(e.sizes), self.posted
            send, receive = (0, e.group_id, rank, e.peer), (1, e.group_id, e.source, rank)
            # the peer's receives of these sends, and the source's sends of these receives
            self.needs[rank, e.handle] = (
                ((1, *send[1:]), posted[send] + n),
                ((0, *receive[1:]), posted[receive] + n),
            )
            posted[send] += n
            posted[receive] += n
        else:
            if e.kind != "wait" and not self.inside[rank]:
                self.entered[e.group_id][rank] += 1
                self.inside[rank] = True
            if self.blocker(rank) is not None:
                return False
            self.inside[rank] = False
        self.at[rank] += 1
        return True

    def done(self, rank: int) -> bool:
        """Whether ``rank`` has run every event."""
        return self.at[rank] == len(self.events[rank])


def _deadlock(logs: list[RankSchedule]) -> list[str]:
    """Whether every rank runs to its end; if not, whom the first one left waits for."""
    run = _Run(logs)
    moved = True
    while moved:
        moved = False
        for rank, events in enumerate(run.events):
            while run.at[rank] < len(events) and run.step(rank):
                moved = True
    stuck = [rank for rank in range(len(logs)) if not run.done(rank)]
    if not stuck:
        return []
    path = [stuck[0]]
    while True:
        rank = path[-1]
        waiting = run.blocker(rank)
        assert waiting is not None
        path.append(waiting)
        if run.done(waiting) or path.count(waiting) > 1:
            break
    chain = ", ".join(
        f"{run.events[r][run.at[r]].where(r)} waits for rank {w}" for r, w in pairwise(path)
    )
    end = "which has finished" if run.done(path[-1]) else "a cycle"
    return [f"deadlock: {chain}: {end}"]
