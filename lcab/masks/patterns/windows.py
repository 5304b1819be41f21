"""Sliding-window masks (two-sided, causal) and sliding window with global tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from typing_extensions import override

from lcab.masks.patterns.base import Generated, PatternParams, band, rect, register_pattern, require


@dataclass
class WindowParams(PatternParams):
    """A window of ``window`` keys on each allowed side of the query."""

    window: int = 1024
    """Window half-width w (paper: 1024); w >= seqlen gives the full (or causal) mask."""

    @override
    def check(self, seqlen: int) -> None:
        require(self.window >= 0, f"window={self.window} must be >= 0")


@register_pattern("sliding_window", WindowParams, "|i - j| <= w (two-sided)")
def sliding_window(seqlen: int, rng: np.random.Generator, p: WindowParams) -> Generated:
    """A band of half-width w around the diagonal."""
    return Generated(band(0, seqlen, 0, seqlen, -p.window, p.window))


@register_pattern("sliding_window_causal", WindowParams, "0 <= i - j <= w")
def sliding_window_causal(seqlen: int, rng: np.random.Generator, p: WindowParams) -> Generated:
    """The w keys before each query, and itself."""
    return Generated(band(0, seqlen, 0, seqlen, -p.window, 0))


@dataclass
class GlobalWindowParams(WindowParams):
    """Sliding window plus global tokens at the start that see and are seen by everything."""

    global_tokens: int = 128
    """Number g of leading global tokens (BigBird/Longformer style)."""

    @override
    def check(self, seqlen: int) -> None:
        super().check(seqlen)
        require(
            0 <= self.global_tokens <= seqlen,
            f"global_tokens={self.global_tokens} must be in [0, seqlen={seqlen}]",
        )


@register_pattern("global_sliding_window", GlobalWindowParams, "|i - j| <= w or i < g or j < g")
def global_sliding_window(
    seqlen: int, rng: np.random.Generator, p: GlobalWindowParams
) -> Generated:
    """Global rows and columns, and the window band on the rest."""
    g = p.global_tokens
    slices = np.concatenate(
        [
            rect(0, g, 0, seqlen),  # global queries see every key
            rect(g, seqlen, 0, g),  # every other query sees the global keys
            band(g, seqlen, g, seqlen, -p.window, p.window),
        ]
    )
    return Generated(slices)
