"""Mask patterns: a name, a typed parameter dataclass and a generator returning slices.

Parameters are a dataclass (defaults, types and validation in one place; the Hydra ``mask/``
group is built from it). Every random choice comes from the seeded generator a pattern gets, so
the same (name, seqlen, params, seed) always yields the same mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from typing_extensions import override

from lcab.masks.doclens import DOC_SOURCES, check_doc_lengths, sample_doc_lengths
from lcab.masks.geometry import INF, IntArray, SliceKind, canonical_slices
from lcab.registry import Registry


@dataclass
class PatternParams:
    """Base of every pattern's parameters; ``check`` validates them against the sequence."""

    def check(self, seqlen: int) -> None:
        """Raise ValueError naming the parameter and its allowed range."""

    def randomized(self) -> bool:
        """Whether the mask depends on the seed (then benchmarks draw several samples)."""
        return False


@dataclass
class DocParams(PatternParams):
    """How documents are packed (shared by every document-based pattern)."""

    doc_source: str = "auto"
    """auto (by length, as the paper) | pile | prolong64k | prolong512k | chatqa | long | uniform
    | fixed | histogram_file."""
    doc_lengths: list[int] | None = None
    """Explicit document lengths (must sum to seqlen); overrides doc_source."""
    doc_len: int = 1024
    """Length of every document for doc_source=fixed (the last one is cut to fit)."""
    min_doc_len: int = 256
    """Shortest document for doc_source=uniform."""
    max_doc_len: int = 4096
    """Longest document for doc_source=uniform."""
    long_fraction: float = 0.6
    """doc_source=long: share of tokens in long documents (paper: 60 %)."""
    long_min_len: int = 8 * 1024
    """doc_source=long: shortest long document (paper: 8K)."""
    long_max_len: int = 30 * 1024
    """doc_source=long: longest long document (paper: 30K)."""
    histogram_file: str | None = None
    """doc_source=histogram_file: path to a JSON histogram file."""
    histogram_name: str | None = None
    """doc_source=histogram_file: which histogram of the file (optional if it holds one)."""
    max_doc_fraction: float | None = None
    """Split documents longer than this share of the sequence (MagiAttention's CP benchmark:
    0.25 with doc_source=chatqa); unset keeps them whole."""

    @override
    def check(self, seqlen: int) -> None:
        if self.doc_source not in DOC_SOURCES:
            raise ValueError(
                f"doc_source={self.doc_source!r} is unknown; valid: {', '.join(DOC_SOURCES)}"
            )
        if self.doc_lengths is not None:
            check_doc_lengths(list(self.doc_lengths), seqlen)
        if self.max_doc_fraction is not None and not 0.0 < self.max_doc_fraction <= 1.0:
            raise ValueError(
                f"max_doc_fraction={self.max_doc_fraction} must be in (0, 1] (or unset)"
            )

    @override
    def randomized(self) -> bool:
        return self.doc_lengths is None and self.doc_source != "fixed"

    def sample(self, seqlen: int, rng: np.random.Generator) -> IntArray:
        """The document lengths of this mask."""
        if self.doc_lengths is not None:
            return check_doc_lengths(list(self.doc_lengths), seqlen)
        return sample_doc_lengths(
            seqlen,
            rng,
            source=self.doc_source,
            doc_len=self.doc_len,
            min_doc_len=self.min_doc_len,
            max_doc_len=self.max_doc_len,
            long_fraction=self.long_fraction,
            long_min_len=self.long_min_len,
            long_max_len=self.long_max_len,
            histogram_file=self.histogram_file,
            histogram_name=self.histogram_name,
            max_doc_fraction=self.max_doc_fraction,
        )


@dataclass
class Generated:
    """What a generator returns: slices (per head via ``head_ptr``) and document lengths."""

    slices: IntArray
    doc_lengths: IntArray | None = None
    head_ptr: IntArray | None = None
    resolved: dict[str, Any] = field(default_factory=dict)
    """Parameter values drawn at random (e.g. a prefix length), recorded for replay."""


Generator = Callable[[int, np.random.Generator, Any], Generated]


@dataclass(frozen=True)
class MaskPattern:
    """A registered pattern: its parameters class, generator and description."""

    name: str
    params_cls: type[PatternParams]
    generate: Generator
    summary: str
    dynamic: bool = False
    """Dynamic (block-sparse) masks differ per KV head and per step; static ones are fixed."""

    @property
    def uses_documents(self) -> bool:
        """Whether the pattern is built from packed documents."""
        return issubclass(self.params_cls, DocParams)

    def param_names(self) -> list[str]:
        """Names of the pattern's parameters, in declaration order."""
        return [f.name for f in dataclasses.fields(self.params_cls)]


MASK_PATTERNS: Registry[MaskPattern] = Registry("mask")


def register_pattern(
    name: str,
    params_cls: type[PatternParams],
    summary: str,
    *,
    aliases: tuple[str, ...] = (),
    dynamic: bool = False,
) -> Callable[[Generator], Generator]:
    """Register a generator function as mask pattern ``name``."""

    def deco(fn: Generator) -> Generator:
        MASK_PATTERNS.add(
            name, MaskPattern(name, params_cls, fn, summary, dynamic=dynamic), aliases
        )
        return fn

    return deco


# ---------------------------------------------------------------------------- slice helpers
def cu_from_lengths(lengths: IntArray) -> IntArray:
    """Document offsets [0, l0, l0+l1, ..., S]."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def diagonal_blocks(cu: IntArray, kind: SliceKind) -> IntArray:
    """One square slice of ``kind`` per document."""
    starts, ends = cu[:-1], cu[1:]
    return np.stack([starts, ends, starts, ends, np.full_like(starts, kind)], 1)


def band(q0: int, q1: int, k0: int, k1: int, lo: int | None, hi: int | None) -> IntArray:
    """Slices of the rectangle [q0,q1) x [k0,k1) restricted to lo <= j - i <= hi."""
    limits = (q0, q1, k0, k1, -INF if lo is None else lo, INF if hi is None else hi)
    return canonical_slices(*(np.array([value]) for value in limits))


def rect(q0: int, q1: int, k0: int, k1: int, kind: SliceKind = SliceKind.FULL) -> IntArray:
    """A single slice as a (1, 5) array (empty if the rectangle is empty)."""
    if q1 <= q0 or k1 <= k0:
        return np.zeros((0, 5), np.int64)
    return np.array([[q0, q1, k0, k1, kind]], dtype=np.int64)


def require(ok: bool, message: str) -> None:
    """Raise ValueError(message) unless ``ok``."""
    if not ok:
        raise ValueError(message)
