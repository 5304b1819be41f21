"""Load balancing: which tokens each context-parallel shard holds.

A `Placement` gives every shard a layout — the global token at each local position, -1 for
padding — all of one length (collectives want equal shards). The balancers (``contiguous``,
the paper's ``zigzag``, the mask-aware ``area``) are described in the cp guide's "Load
balancing". A shard's work is the attended area of its query rows (averaged over mask heads);
imbalance = max / mean over shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, row_spans

BALANCERS = ("contiguous", "zigzag", "area")
#: Chunks per shard the area balancer tries, fewest first (fewer chunks: fewer, larger pieces
#: per ring step); it keeps the first that reaches `AREA_GOOD_ENOUGH`, else the most balanced.
AREA_CHUNKS_PER_SHARD = (8, 16, 32, 64)
AREA_GOOD_ENOUGH = 1.01


@dataclass(frozen=True)
class Placement:
    """Layouts of the shards (equal lengths; -1 is padding)."""

    layouts: tuple[IntArray, ...]
    balancer: str

    @property
    def shard_len(self) -> int:
        """Local positions per shard (padding included)."""
        return len(self.layouts[0])

    @property
    def padding_tokens(self) -> int:
        """Padding positions over all shards."""
        return int(sum((layout < 0).sum() for layout in self.layouts))

    def areas(self, mask: AttnMask) -> np.ndarray:
        """Attended area of each shard's query rows (mean over mask heads)."""
        work = row_work(mask)
        return np.array([work[layout[layout >= 0]].sum() for layout in self.layouts])

    def imbalance(self, mask: AttnMask) -> float:
        """Max / mean shard area (1.0 = perfect)."""
        areas = self.areas(mask)
        mean = areas.mean()
        return float(areas.max() / mean) if mean > 0 else 1.0

    def split(self, pieces: int) -> Placement:
        """Cut every shard into ``pieces`` contiguous sub-shards (shard-major order).

        Used by 2-D strategies: the ring shards split among the Ulysses members of a group.
        """
        if self.shard_len % pieces:
            raise ValueError(f"shard length {self.shard_len} is not a multiple of {pieces}")
        out = [part for layout in self.layouts for part in np.split(layout, pieces)]
        return Placement(tuple(out), self.balancer)


_ROW_WORK: dict[tuple[int, bytes, bytes], np.ndarray] = {}
"""`row_work` of the latest masks, by content: a planner's recommendation weighs a dozen
placements of the same mask, and each asked for it (a quarter of its time at 96 ranks)."""
_ROW_WORK_KEPT = 32
"""Masks kept (a 786K-token mask's row work is 6 MB): a sweep's lengths x mask samples."""


def row_work(mask: AttnMask) -> np.ndarray:
    """Attended keys of every query row, averaged over mask heads (float64, length Sq).

    Read-only: one array answers every call on an equal mask.
    """
    key = (mask.seqlen_q, mask.slices.tobytes(), mask.head_ptr.tobytes())
    if key in _ROW_WORK:
        return _ROW_WORK[key]
    work = np.zeros(mask.seqlen_q)
    for h in range(mask.num_heads):
        rows, first, last = row_spans(mask.head_slices(h))
        work += np.bincount(rows, weights=last - first + 1, minlength=mask.seqlen_q)
    work /= mask.num_heads
    work.flags.writeable = False
    while len(_ROW_WORK) >= _ROW_WORK_KEPT:
        del _ROW_WORK[next(iter(_ROW_WORK))]  # the oldest
    _ROW_WORK[key] = work
    return work


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _pad(tokens: IntArray, length: int) -> IntArray:
    return np.concatenate([tokens, np.full(length - len(tokens), -1, dtype=np.int64)])


def contiguous(seqlen: int, shards: int, multiple: int = 1) -> Placement:
    """Equal contiguous chunks; the end is padded to a multiple of ``shards * multiple``."""
    total = _round_up(seqlen, shards * multiple)
    tokens = _pad(np.arange(seqlen, dtype=np.int64), total)
    return Placement(tuple(np.split(tokens, shards)), "contiguous")


def zigzag(doc_lengths: IntArray, shards: int, multiple: int = 1) -> Placement:
    """The paper's per-document head-tail split: shard p holds pieces p and 2·shards-1-p.

    A document padded to a multiple of 2·shards gives every shard two pieces; built for all
    shards at once (96 ranks over hundreds of documents would be ~10^5 pieces one by one).
    """
    chunks = 2 * shards
    lengths = np.asarray(doc_lengths, dtype=np.int64).reshape(-1)
    piece = -(-lengths // chunks)  # c of every document (its padded length / 2·shards)
    starts = np.cumsum(lengths) - lengths
    doc = np.repeat(np.arange(len(lengths)), 2 * piece)  # the document of each layout column
    column = np.arange(len(doc), dtype=np.int64) - np.repeat(
        np.cumsum(2 * piece) - 2 * piece, 2 * piece
    )
    tail = column >= piece[doc]  # the second of a document's two pieces
    offset = np.where(tail, column - piece[doc], column)
    shard = np.arange(shards, dtype=np.int64)[:, None]
    index = np.where(tail[None, :], chunks - 1 - shard, shard)  # the piece each shard holds
    within = index * piece[doc][None, :] + offset[None, :]  # position inside the document
    tokens = np.where(within < lengths[doc][None, :], starts[doc][None, :] + within, -1)
    total = _round_up(tokens.shape[1], multiple)
    return Placement(tuple(_pad(layout, total) for layout in tokens), "zigzag")


def area_balanced(
    mask: AttnMask,
    shards: int,
    multiple: int = 1,
    chunks_per_shard: int | tuple[int, ...] = AREA_CHUNKS_PER_SHARD,
) -> Placement:
    """Deal equal contiguous chunks to shards by attended area, largest first (LPT)."""
    work = row_work(mask)
    choices = (chunks_per_shard,) if isinstance(chunks_per_shard, int) else chunks_per_shard
    best: tuple[float, tuple[IntArray, ...]] | None = None
    for k in choices:
        layouts, imbalance = _deal(work, shards, multiple, k)
        if best is None or imbalance < best[0] - 1e-12:
            best = (imbalance, layouts)
        if imbalance <= AREA_GOOD_ENOUGH:
            break
    assert best is not None
    return Placement(best[1], "area")


def _deal(
    work: np.ndarray, shards: int, multiple: int, chunks_per_shard: int
) -> tuple[tuple[IntArray, ...], float]:
    """(layouts, imbalance) of one LPT deal of ``shards * chunks_per_shard`` equal chunks."""
    seqlen = len(work)
    n_chunks = shards * chunks_per_shard
    chunk = _round_up(
        -(-seqlen // n_chunks), max(1, multiple // np.gcd(multiple, chunks_per_shard))
    )
    while (chunk * chunks_per_shard) % multiple:
        chunk += 1
    tokens = _pad(np.arange(seqlen, dtype=np.int64), chunk * n_chunks)
    pieces = np.split(tokens, n_chunks)
    padded_work = np.concatenate([work, np.zeros(len(tokens) - seqlen)])
    chunk_area = padded_work.reshape(n_chunks, chunk).sum(axis=1)
    load = np.zeros(shards)
    count = np.zeros(shards, dtype=np.int64)
    owner = np.empty(n_chunks, dtype=np.int64)
    for c in np.argsort(-chunk_area, kind="stable"):
        open_shards = np.flatnonzero(count < chunks_per_shard)
        p = open_shards[np.argmin(load[open_shards])]
        owner[c] = p
        load[p] += chunk_area[c]
        count[p] += 1
    layouts = tuple(
        np.concatenate([pieces[c] for c in np.flatnonzero(owner == p)]) for p in range(shards)
    )
    mean = load.mean()
    return layouts, float(load.max() / mean) if mean > 0 else 1.0


def place(mask: AttnMask, shards: int, balancer: str, multiple: int = 1) -> Placement:
    """Place ``mask``'s tokens on ``shards`` shards with ``balancer``.

    ``multiple``: every shard length must be a multiple of it (2-D strategies split shards).

    Raises:
        ValueError: unknown balancer (the message lists the valid ones).

    """
    if balancer == "contiguous":
        return contiguous(mask.seqlen_q, shards, multiple)
    if balancer == "zigzag":
        docs = mask.doc_lengths if mask.doc_lengths is not None else np.array([mask.seqlen_q])
        return zigzag(docs, shards, multiple)
    if balancer == "area":
        return area_balanced(mask, shards, multiple)
    raise ValueError(f"cp.balance={balancer!r} is unknown; valid: {', '.join(BALANCERS)}")
