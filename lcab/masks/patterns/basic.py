"""The two regular single-sequence masks: full and causal."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcab.masks.geometry import SliceKind
from lcab.masks.patterns.base import Generated, PatternParams, rect, register_pattern


@dataclass
class NoParams(PatternParams):
    """Patterns without parameters."""


@register_pattern("full", NoParams, "every query attends every key")
def full(seqlen: int, rng: np.random.Generator, p: NoParams) -> Generated:
    """One full slice over the whole sequence."""
    return Generated(rect(0, seqlen, 0, seqlen))


@register_pattern("causal", NoParams, "j <= i")
def causal(seqlen: int, rng: np.random.Generator, p: NoParams) -> Generated:
    """One causal slice over the whole sequence."""
    return Generated(rect(0, seqlen, 0, seqlen, SliceKind.CAUSAL))
