"""Prefix-LM masks: a bidirectional prefix, causal after it (whole sequence or per document)."""

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
    rect,
    register_pattern,
    require,
)


@dataclass
class PrefixParams(PatternParams):
    """Prefix length p; keys j < p are visible to every query."""

    prefix: int | None = None
    """Prefix length p in [0, seqlen]; None draws it uniformly from [1, seqlen] (paper)."""

    @override
    def check(self, seqlen: int) -> None:
        require(
            self.prefix is None or 0 <= self.prefix <= seqlen,
            f"prefix={self.prefix} must be in [0, seqlen={seqlen}] (or None to draw it)",
        )

    @override
    def randomized(self) -> bool:
        return self.prefix is None


@register_pattern("prefix_lm_causal", PrefixParams, "j < p or j <= i")
def prefix_lm_causal(seqlen: int, rng: np.random.Generator, p: PrefixParams) -> Generated:
    """A full prefix block, then causal rows over every key."""
    prefix = int(rng.integers(1, seqlen + 1)) if p.prefix is None else p.prefix
    slices = np.concatenate(
        [rect(0, prefix, 0, prefix), rect(prefix, seqlen, 0, seqlen, SliceKind.CAUSAL)]
    )
    return Generated(slices, resolved={"prefix": prefix})


@dataclass
class PrefixDocParams(DocParams):
    """Documents, each with a bidirectional prefix of the same length p."""

    prefix: int | None = None
    """Prefix length p >= 0 applied to every document; None draws it from [1, len(doc 0)]
    (paper). A document not longer than p is fully bidirectional."""

    @override
    def check(self, seqlen: int) -> None:
        super().check(seqlen)
        require(
            self.prefix is None or 0 <= self.prefix <= seqlen,
            f"prefix={self.prefix} must be in [0, seqlen={seqlen}] (or None to draw it)",
        )

    @override
    def randomized(self) -> bool:
        return super().randomized() or self.prefix is None


@register_pattern("prefix_lm_document", PrefixDocParams, "d(i) = d(j) and (j - s_d < p or j <= i)")
def prefix_lm_document(seqlen: int, rng: np.random.Generator, p: PrefixDocParams) -> Generated:
    """Per document: full prefix block, then causal rows over the document's keys."""
    lengths = p.sample(seqlen, rng)
    prefix = int(rng.integers(1, lengths[0] + 1)) if p.prefix is None else p.prefix
    cu = cu_from_lengths(lengths)
    starts, ends = cu[:-1], cu[1:]
    split = np.minimum(starts + prefix, ends)
    head = np.stack([starts, split, starts, split, np.full_like(starts, SliceKind.FULL)], 1)
    tail = np.stack([split, ends, starts, ends, np.full_like(starts, SliceKind.CAUSAL)], 1)
    slices = np.stack([head, tail], 1).reshape(-1, 5)
    slices = slices[(slices[:, 1] > slices[:, 0]) & (slices[:, 3] > slices[:, 2])]
    return Generated(slices, lengths, resolved={"prefix": prefix})
