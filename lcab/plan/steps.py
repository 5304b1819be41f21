"""What one kernel call of a replayed schedule computes, as the cost model reads it.

A strategy states its schedule as stages of calls and transfers (`lcab.cp.stages`);
`lcab.plan.replay` makes each call a `Work` (`lcab.plan.calls`), which `lcab.plan.model` costs.
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

    A dense-mask kernel runs a full or a causal mask without one (`lcab.kernels.sdpa`): (0, 0)
    when the area is a whole rectangle or a square's lower triangle with its diagonal.
    """
    if area >= q_tokens * k_tokens or (
        q_tokens == k_tokens and area == q_tokens * (q_tokens + 1) / 2
    ):
        return 0.0, 0.0
    return q_tokens, k_tokens
