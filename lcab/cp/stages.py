"""A rank's schedule as data: each pass's kernel calls and the transfers they hide or wait for.

Every strategy states its schedule in these terms (`lcab.cp.base.Strategy.schedule`): a *stage*
is one kernel call (or none) with the transfers in flight while it runs (``during``) and those
waited for after it (``after``); a *window* is a run of stages with transfers in its background
(LoongTrain's prefetched block). The planner prices it (`lcab.plan.replay`); the schedule
check holds the runner to it, transfer by transfer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Transfer:
    """Bytes one rank sends in one communication call."""

    op: str
    """The operation name the runner counts it under (``ring_kv``, ``a2a``, ...)."""
    kind: str
    """p2p | a2a | allgather | reduce_scatter (collective efficiency differs)."""
    nbytes: int
    inter_bytes: int
    """Part of ``nbytes`` that leaves the node."""
    phases: int = 1
    """Times the bytes cross the link one after the other (an unbatched ring exchange: 2)."""


@dataclass(frozen=True)
class Stage:
    """A kernel call (or none) with the transfers it overlaps and those exposed after it.

    Calls are what the `Pricer` made of them (`lcab.plan.steps.Work` in the planner).
    """

    work: Any
    during: tuple[Transfer, ...] = ()
    after: tuple[Transfer, ...] = ()
    then: tuple[Any, ...] = ()
    """More calls the rank runs after ``work`` before the stage ends, with nothing to wait for
    in between (Ring All-Gather's two calls between its collectives): they add up per rank,
    and only their sum waits for the slowest rank."""
    finish: tuple[Any, ...] = ()
    """Work that needs what the ``during`` transfers bring, so it starts once both the calls
    and those transfers are done (the published ring backward adds a step's dK/dV into the
    accumulator that arrived with its transfer): it is not hidden behind them."""

    @property
    def calls(self) -> tuple[Any, ...]:
        """Every call of the stage, in order."""
        return tuple(w for w in (self.work, *self.then) if w is not None)


@dataclass(frozen=True)
class Window:
    """Stages in order, with transfers running in the background of all of them."""

    stages: tuple[Stage, ...]
    background: tuple[Transfer, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Implementation:
    """Where implementations of one schedule send or wait differently (defaults: lcab's runner).

    The planner also prices the code that produced the published figures
    (`lcab.plan.harness.LONGCA`), which runs the same strategies with these differences.
    """

    dkv_in_accumulator: bool = True
    """dK/dV travel in the accumulator dtype (True) or the element dtype (False)."""
    regather_bwd: bool = False
    """Ring All-Gather's backward gathers K/V again before its kernel."""
    home_hop: frozenset[str] | None = None
    """Strategies whose ring backward waits at once for each window's last inner dK/dV hop,
    which brings the window block's accumulator home (None: every strategy's, as lcab's runner;
    the published code: LoongTrain's, whose Ring and USP send it with the next K/V block)."""
    allgather_halves: bool = False
    """Ring All-Gather on a zigzag placement calls its kernel once per half of its queries (the
    chunks ``p`` and ``2P - 1 - p`` of every document), each against the keys that half
    attends (True), or once with all its queries (False)."""


RUNNER = Implementation()


class Pricer(Protocol):
    """What a schedule's calls and transfers are made of (the planner's `lcab.plan.replay`)."""

    @property
    def links(self) -> Links:
        """The transfers' maker."""

    @property
    def impl(self) -> Implementation:
        """Whose implementation of the schedule."""

    def call(
        self, family: str, rows: int, keys: int, member: int, bwd: bool
    ) -> tuple[Any, tuple[Any, ...]]:
        """(the call, the work that waits for its stage's transfers); the call None: empty.

        Of row set ``rows`` against key set ``keys`` (`Strategy.block_sets`) by Ulysses member
        ``member``; ``family`` (ulysses | allgather | ring) names the copies an implementation
        makes around such a call.
        """

    def copies(self, what: str, bwd: bool, q_tokens: int, kv_tokens: int) -> Any:
        """Copies made outside the calls over tensors of so many tokens (None: none)."""

    def merge(self, rows: int, keys: list[int], bwd: bool) -> Any:
        """Merging the ring calls' partial results after the last (None: each step merges)."""


class Links:
    """Which peers are on another node (ranks are node-major).

    Equal transfers and stages are one object (`one`, `stage`): the cost model costs each
    object once (`lcab.plan.model`), and 96 ranks x 96 steps hold few distinct ones.
    """

    def __init__(self, devices_per_node: int, p2p_batched: bool = True) -> None:
        self.per_node = devices_per_node
        self.p2p_batched = p2p_batched
        self._transfers: dict[Transfer, Transfer] = {}
        self._p2p: dict[tuple[str, int, bool, int], Transfer] = {}
        self._tuples: dict[tuple[Transfer, ...], tuple[Transfer, ...]] = {}
        self._stages: dict[tuple[int, ...], Stage] = {}

    def one(self, transfer: Transfer) -> Transfer:
        """The object of every transfer equal to ``transfer``."""
        return self._transfers.setdefault(transfer, transfer)

    def transfers(self, transfers: tuple[Transfer, ...]) -> tuple[Transfer, ...]:
        """The object of every tuple equal to ``transfers``."""
        return self._tuples.setdefault(transfers, transfers)

    def stage(
        self,
        work: Any,
        during: tuple[Transfer, ...] = (),
        after: tuple[Transfer, ...] = (),
        finish: tuple[Any, ...] = (),
    ) -> Stage:
        """``Stage(work, during, after, finish=finish)``, one object for equal parts.

        The transfers and the pricer's calls are one object per value, so the parts' ids name it.
        """
        during, after = self.transfers(during), self.transfers(after)
        key = (id(work), id(during), id(after), id(finish))
        stage = self._stages.get(key)
        if stage is None:
            stage = self._stages[key] = Stage(work, during, after, finish=finish)
        return stage

    def inter(self, a: int, b: int) -> bool:
        """Whether ranks ``a`` and ``b`` are on different nodes."""
        return a // self.per_node != b // self.per_node

    def p2p(self, op: str, nbytes: int, src: int, dst: int, ring_size: int) -> Transfer:
        """A ring exchange's send; unbatched in a ring of two it waits for the receive."""
        key = (op, nbytes, src // self.per_node != dst // self.per_node, ring_size)
        transfer = self._p2p.get(key)
        if transfer is None:
            far = nbytes if self.inter(src, dst) else 0
            phases = 2 if ring_size == 2 and not self.p2p_batched else 1
            transfer = self._p2p[key] = self.one(Transfer(op, "p2p", nbytes, far, phases))
        return transfer

    def collective(self, op: str, kind: str, nbytes: int, rank: int, group: list[int]) -> Transfer:
        """The part of a collective's bytes that crosses this rank's own NIC.

        An all-to-all sends a distinct block to every peer, so the blocks for other nodes all
        leave through the rank's NIC. A ring collective (all-gather, reduce-scatter) is run by
        NCCL as several rings, one per channel, and on rail-optimised nodes (one NIC per GPU, as
        DGX/HGX H100) each ring leaves a node through a different GPU: every remote shard crosses
        into a node once, spread over its NICs. Of the ``(P - 1)`` shards a rank gathers, its NIC
        then carries ``nodes - 1``; the rest moves over NVLink.
        """
        if kind == "a2a":
            peers = [p for p in group if p != rank]
            far = sum(self.inter(rank, p) for p in peers)
            return self.one(Transfer(op, kind, nbytes, nbytes * far // max(len(peers), 1)))
        nodes = len({p // self.per_node for p in group})
        return self.one(Transfer(op, kind, nbytes, nbytes * (nodes - 1) // max(len(group) - 1, 1)))
