"""Dynamic block-sparse masks: per KV head, a random top-k of key blocks per query block.

The paper's "sparsity ratio" is the fraction of key blocks each query block *keeps*; lcab calls
it ``density``. Scores are random (the paper's stand-in for real importance scores), drawn per
KV head from the mask's seeded generator, so every kernel sees the same pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from typing_extensions import override

from lcab.masks.geometry import IntArray, SliceKind
from lcab.masks.patterns.base import Generated, PatternParams, register_pattern, require


def _check_density(density: float) -> None:
    require(0.0 < density <= 1.0, f"density={density} must be in (0, 1]")


def _kept_blocks(
    rng: np.random.Generator, heads: int, n_q: int, n_k: int, density: float
) -> np.ndarray:
    """Boolean (heads, n_q, n_k): the top-k of random scores per query-block row."""
    keep = max(1, math.floor(density * n_k + 1e-9))
    scores = rng.random((heads, n_q, n_k))
    if keep >= n_k:
        return np.ones((heads, n_q, n_k), dtype=bool)
    top = np.argpartition(-scores, keep - 1, axis=-1)[..., :keep]
    kept = np.zeros((heads, n_q, n_k), dtype=bool)
    np.put_along_axis(kept, top, True, axis=-1)
    return kept


def _runs_to_slices(kept: np.ndarray, q_cu: IntArray, k_cu: IntArray) -> IntArray:
    """Full slices for runs of consecutive kept key blocks in each query-block row (one head)."""
    n_q, n_k = kept.shape
    padded = np.zeros((n_q, n_k + 2), dtype=np.int8)
    padded[:, 1:-1] = kept
    edges = np.diff(padded, axis=1)
    rows, run_start = np.nonzero(edges == 1)
    _, run_end = np.nonzero(edges == -1)
    return np.stack(
        [
            q_cu[rows],
            q_cu[rows + 1],
            k_cu[run_start],
            k_cu[run_end],
            np.full_like(rows, SliceKind.FULL),
        ],
        1,
    ).astype(np.int64)


def _heads_to_generated(parts: list[IntArray]) -> Generated:
    ptr = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return Generated(np.concatenate(parts), head_ptr=ptr)


@dataclass
class BlockSparseParams(PatternParams):
    """Uniform blocks; per KV head each query block keeps ``density`` of the key blocks."""

    block_size: int = 128
    """Query and key block size (paper: 64 or 128)."""
    density: float = 0.5
    """Kept fraction of key blocks per query block (the paper's "sparsity ratio"; 0.2/0.5/0.8)."""
    heads: int = 1
    """Number of mask heads (set to the KV head count; query heads of a group share one)."""

    @override
    def check(self, seqlen: int) -> None:
        require(self.block_size >= 1, f"block_size={self.block_size} must be >= 1")
        _check_density(self.density)
        require(self.heads >= 1, f"heads={self.heads} must be >= 1")

    @override
    def randomized(self) -> bool:
        return True


@register_pattern(
    "block_sparse",
    BlockSparseParams,
    "random top-k key blocks per query block, per KV head",
    dynamic=True,
)
def block_sparse(seqlen: int, rng: np.random.Generator, p: BlockSparseParams) -> Generated:
    """Uniform block grid; the last block is shorter if block_size does not divide seqlen."""
    n = math.ceil(seqlen / p.block_size)
    cu = np.minimum(np.arange(n + 1, dtype=np.int64) * p.block_size, seqlen)
    kept = _kept_blocks(rng, p.heads, n, n, p.density)
    return _heads_to_generated([_runs_to_slices(kept[h], cu, cu) for h in range(p.heads)])


@dataclass
class VarBlockSparseParams(PatternParams):
    """Random block partitions of rows and columns per KV head, then top-k per row block."""

    avg_block_size: int = 512
    """Average block size; the number of blocks is seqlen // avg_block_size (paper: 128-1024)."""
    min_block_size: int = 128
    """Smallest block (paper: 128)."""
    density: float = 0.5
    """Kept fraction of key blocks per query block."""
    heads: int = 1
    """Number of mask heads (set to the KV head count)."""

    @override
    def check(self, seqlen: int) -> None:
        require(
            1 <= self.min_block_size <= self.avg_block_size,
            f"need 1 <= min_block_size <= avg_block_size; got min_block_size="
            f"{self.min_block_size}, avg_block_size={self.avg_block_size}",
        )
        _check_density(self.density)
        require(self.heads >= 1, f"heads={self.heads} must be >= 1")

    @override
    def randomized(self) -> bool:
        return True


def _random_partition(rng: np.random.Generator, total: int, count: int, minimum: int) -> IntArray:
    """Cumulative offsets of ``count`` blocks of at least ``minimum`` tokens covering ``total``."""
    slack = total - count * minimum
    cuts = np.sort(rng.integers(0, slack + 1, size=count - 1))
    sizes = minimum + np.diff(np.concatenate([[0], cuts, [slack]]))
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


@register_pattern(
    "varblock_sparse",
    VarBlockSparseParams,
    "variable-size blocks, random top-k per KV head",
    dynamic=True,
)
def varblock_sparse(seqlen: int, rng: np.random.Generator, p: VarBlockSparseParams) -> Generated:
    """Row and column partitions drawn per head; each row block keeps ``density`` of columns."""
    count = max(1, min(seqlen // p.avg_block_size, seqlen // p.min_block_size))
    minimum = min(p.min_block_size, seqlen)
    parts = []
    for _ in range(p.heads):
        q_cu = _random_partition(rng, seqlen, count, minimum)
        k_cu = _random_partition(rng, seqlen, count, minimum)
        kept = _kept_blocks(rng, 1, count, count, p.density)[0]
        parts.append(_runs_to_slices(kept, q_cu, k_cu))
    return _heads_to_generated(parts)
