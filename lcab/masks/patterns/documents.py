"""Masks over packed documents: block-diagonal, shared question, blockwise and block-causal.

``d(x)`` is the document of token x; document boundaries come from the pattern's document
sampler (real-corpus histograms by default) and are stored in the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from typing_extensions import override

from lcab.masks.geometry import SliceKind
from lcab.masks.patterns.base import (
    DocParams,
    Generated,
    PatternParams,
    cu_from_lengths,
    diagonal_blocks,
    rect,
    register_pattern,
    require,
)


@register_pattern("full_document", DocParams, "d(i) = d(j)")
def full_document(seqlen: int, rng: np.random.Generator, p: DocParams) -> Generated:
    """One full block per document."""
    lengths = p.sample(seqlen, rng)
    return Generated(diagonal_blocks(cu_from_lengths(lengths), SliceKind.FULL), lengths)


@register_pattern("causal_document", DocParams, "d(i) = d(j) and j <= i", aliases=("document",))
def causal_document(seqlen: int, rng: np.random.Generator, p: DocParams) -> Generated:
    """One causal block per document."""
    lengths = p.sample(seqlen, rng)
    return Generated(diagonal_blocks(cu_from_lengths(lengths), SliceKind.CAUSAL), lengths)


@register_pattern(
    "share_question",
    DocParams,
    "(d(i) = d(j) and j <= i) or (d(j) = 0 and d(i) != 0): answers see the question (doc 0)",
)
def share_question(seqlen: int, rng: np.random.Generator, p: DocParams) -> Generated:
    """Causal documents, plus every answer document seeing the whole question document."""
    lengths = p.sample(seqlen, rng)
    cu = cu_from_lengths(lengths)
    question_end = int(cu[1])
    slices = np.concatenate(
        [
            diagonal_blocks(cu, SliceKind.CAUSAL),
            rect(question_end, seqlen, 0, question_end),  # answers -> question, full
        ]
    )
    return Generated(slices, lengths)


@register_pattern(
    "causal_blockwise",
    DocParams,
    "(d(i) = d(j) and j <= i) or (d(i) = last and d(j) != last): the last doc sees everything",
)
def causal_blockwise(seqlen: int, rng: np.random.Generator, p: DocParams) -> Generated:
    """Causal documents; the last one (the test example) attends causally to the whole pack."""
    lengths = p.sample(seqlen, rng)
    cu = cu_from_lengths(lengths)
    last_start = int(cu[-2])
    slices = np.concatenate(
        [
            diagonal_blocks(cu[:-1], SliceKind.CAUSAL),
            # bottom-right causal over all keys: k <= q, i.e. every earlier token plus itself
            rect(last_start, seqlen, 0, seqlen, SliceKind.CAUSAL),
        ]
    )
    return Generated(slices, lengths)


@dataclass
class BlockCausalParams(PatternParams):
    """Documents made of whole blocks; block b of a document sees blocks 0..b of it."""

    block_size: int = 1024
    """Tokens per block (paper: 1024); must divide seqlen."""
    min_blocks: int = 1
    """Fewest blocks per document (paper: 1)."""
    max_blocks: int = 8
    """Most blocks per document (paper: 8)."""

    @override
    def check(self, seqlen: int) -> None:
        require(self.block_size >= 1, f"block_size={self.block_size} must be >= 1")
        require(
            seqlen % self.block_size == 0,
            f"block_size={self.block_size} must divide seqlen={seqlen} for block_causal_document "
            f"(valid block sizes divide {seqlen})",
        )
        require(
            1 <= self.min_blocks <= self.max_blocks,
            f"need 1 <= min_blocks <= max_blocks; got min_blocks={self.min_blocks}, "
            f"max_blocks={self.max_blocks}",
        )
        blocks = seqlen // self.block_size
        require(
            _splittable(np.array([blocks]), self.min_blocks, self.max_blocks)[0],
            f"{blocks} blocks cannot be split into documents of min_blocks={self.min_blocks} to "
            f"max_blocks={self.max_blocks} blocks; change block_size, min_blocks or max_blocks",
        )

    @override
    def randomized(self) -> bool:
        return self.min_blocks != self.max_blocks


def _splittable(n: np.ndarray, low: int, high: int) -> np.ndarray:
    """Whether n blocks split into documents of low..high blocks (some k: k*low <= n <= k*high)."""
    return (n == 0) | (-(-n // high) <= n // low)


def _document_blocks(rng: np.random.Generator, total: int, low: int, high: int) -> np.ndarray:
    """Blocks per document, each in [low, high], summing to ``total``.

    Each document draws uniformly among the sizes that leave a splittable remainder, so no
    document is cut below ``low`` (with low = 1 this is the paper's uniform 1..8 draw).
    """
    out = []
    left = total
    while left:
        sizes = np.arange(low, min(high, left) + 1)
        sizes = sizes[_splittable(left - sizes, low, high)]
        size = int(rng.choice(sizes))
        out.append(size)
        left -= size
    return np.array(out, dtype=np.int64)


@register_pattern(
    "block_causal_document",
    BlockCausalParams,
    "d(i) = d(j) and floor((j - s_d) / B) <= floor((i - s_d) / B)",
)
def block_causal_document(seqlen: int, rng: np.random.Generator, p: BlockCausalParams) -> Generated:
    """Per document, each block of queries sees its own block and every earlier one, fully."""
    num_blocks = seqlen // p.block_size
    blocks_per_doc = _document_blocks(rng, num_blocks, p.min_blocks, p.max_blocks)
    doc_start_block = np.repeat(np.cumsum(blocks_per_doc) - blocks_per_doc, blocks_per_doc)
    block = np.arange(num_blocks, dtype=np.int64)
    q0 = block * p.block_size
    slices = np.stack(
        [
            q0,
            q0 + p.block_size,
            doc_start_block * p.block_size,
            q0 + p.block_size,
            np.full_like(q0, SliceKind.FULL),
        ],
        1,
    )
    return Generated(slices, blocks_per_doc * p.block_size)
