"""What a replayed rank does: kernel calls, transfers, and the stages that order them.

`lcab.plan.replay` builds these from a strategy's plan; `lcab.plan.model` costs them. A stage is
one kernel call (or none) with the transfers it hides and those exposed after it; a window is a
run of stages with transfers in its background (LoongTrain's next-window prefetch). `Links`
makes a replay's transfers (which part of a send leaves the node) and its stages, one object
for equal ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    """One kernel call on one rank."""

    flops: float
    """Useful FLOPs of the call (lcab's convention, this pass)."""
    mean_keys: float
    """Attended keys per active query row: how long the rows the kernel gets are."""
    rows: float = 0.0
    """Query rows with work (per head)."""
    runs: float = 0.0
    """Runs of consecutive such rows: each starts a query tile, padded to the tile height."""
    memory_bytes: float = 0.0
    """Memory traffic outside the kernel: merging partial results and accumulating gradients
    (float32 accumulators read and written once per step), bounded by memory bandwidth."""
    q_per_kv: float = 1.0
    """Query heads per KV head in the call (a kernel that packs them fills tiles faster)."""
    mean_queries: float = 0.0
    """Queries per attended key: how long the columns a backward kernel sweeps are (0: as
    ``mean_keys``)."""
    matmul_flops: float = 0.0
    """Matrix-product FLOPs outside attention that the timed pass also runs (the measured
    harness's projection gradients); 0 for an attention call."""
    q_elements: float = 0.0
    """Elements of the query-sized tensors the call is given (tokens x local query heads x head
    dim): a backward kernel's own pre- and post-processing runs over all of them."""
    kv_elements: float = 0.0
    """Elements of the key-sized tensors the call is given (tokens x local KV heads x head dim)."""
    q_row_elements: float = 0.0
    """Elements of one query token (local query heads x head dim)."""
    kv_row_elements: float = 0.0
    """Elements of one key token (local KV heads x head dim)."""
    q_heads: float = 0.0
    """Query heads of the call (a backward kernel launches its grid per query head)."""
    sequences: float = 0.0
    """Sequences of the varlen call (``cu_seqlens`` entries, the empty ones included)."""
    key_columns: float = 0.0
    """Attended key columns of the call (per head)."""
    key_documents: float = 0.0
    """Sequences with attended key columns."""
    key_runs: float = 0.0
    """Runs of consecutive attended key columns the kernel sees (a varlen call holds each
    sequence's keys in one piece: its sequences with keys); each ends in a partly filled key
    tile of the backward, and the query runs of a call are shared among them."""
    longest_keys: float = 0.0
    """Attended key columns of the longest such sequence (the call's ``max_seqlen_k``)."""
    gather_bytes: float = 0.0
    """The part of ``memory_bytes`` read through an index (the published code's unpad and
    zigzag reorders), which runs below a plain copy's rate."""
    scatter_bytes: float = 0.0
    """The part of ``memory_bytes`` written through an index (the published code's pad),
    slower still."""
    diagonal_rows: float = 0.0
    """Query rows (per head) whose keys a band edge ends inside the call: a kernel that masks
    whole pieces afterwards computes a staircase past each (`lcab.plan.areas_diagonal`)."""
    diagonal_runs: float = 0.0
    """Runs of such rows (each cut into pieces of the kernel's height)."""
    head_dim: float = 0.0
    """Head dimension of the call (0: unknown): a kernel whose work per attended position is
    not all products (a CPU kernel's softmax passes) runs faster per FLOP at a larger one."""
    dense_rows: float = 0.0
    """Query tokens of the call when its mask is neither full nor exactly causal, where a kernel
    that takes a dense mask (`KernelRate.dense_mask`) computes ``dense_rows x dense_keys``
    positions per query head (``q_heads``) whatever the area; 0: the call needs no dense mask."""
    dense_keys: float = 0.0
    """Key tokens of that rectangle."""


def dense_rectangle(area: float, q_tokens: float, k_tokens: float) -> tuple[float, float]:
    """(``dense_rows``, ``dense_keys``) of a call attending ``area`` positions per head.

    A dense-mask kernel runs a full or a causal mask without one (PyTorch SDPA: ``is_causal``
    when the mask is one full or causal slice over a square, `lcab.kernels.sdpa`); the area
    tells them apart here (a whole rectangle, or a square's lower triangle with its diagonal),
    which a mask of several slices adding up to a triangle would pass too: (0, 0) for those.
    """
    if area >= q_tokens * k_tokens or (
        q_tokens == k_tokens and area == q_tokens * (q_tokens + 1) / 2
    ):
        return 0.0, 0.0
    return q_tokens, k_tokens


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
    """A kernel call (or none) with the transfers it overlaps and those exposed after it."""

    work: Work | None
    during: tuple[Transfer, ...] = ()
    after: tuple[Transfer, ...] = ()
    then: tuple[Work | None, ...] = ()
    """More calls the rank runs after ``work`` before the stage ends, with nothing to wait for
    in between (Ring All-Gather's two calls between its collectives): they add up per rank,
    and only their sum waits for the slowest rank."""
    finish: tuple[Work, ...] = ()
    """Work that needs what the ``during`` transfers bring, so it starts once both the calls
    and those transfers are done (the published ring backward adds a step's dK/dV into the
    accumulator that arrived with its transfer): it is not hidden behind them."""

    @property
    def calls(self) -> tuple[Work, ...]:
        """Every call of the stage, in order."""
        return tuple(w for w in (self.work, *self.then) if w is not None)


@dataclass(frozen=True)
class Window:
    """Stages in order, with transfers running in the background of all of them."""

    stages: tuple[Stage, ...]
    background: tuple[Transfer, ...] = ()


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
        work: Work | None,
        during: tuple[Transfer, ...],
        after: tuple[Transfer, ...],
        finish: tuple[Work, ...],
    ) -> Stage:
        """``Stage(work, during, after, finish=finish)``, one object for equal parts.

        Every part is one object per value (the replay's `CallWorks` and `transfers`, which
        hold them while the replay lives), so the parts' ids name the stage.
        """
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
