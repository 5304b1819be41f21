"""What a replayed rank does: kernel calls, transfers, and the stages that order them.

`lcab.plan.replay` builds these from a strategy's plan; `lcab.plan.model` costs them. A stage is
one kernel call (or none) with the transfers it hides and those exposed after it; a window is a
run of stages with transfers in its background (LoongTrain's next-window prefetch).
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
