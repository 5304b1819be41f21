"""Packed document lengths: histograms of real corpora and the samplers that pack them.

lcab ships LongCA-bench's three histograms (Pile, ProLong64K, ProLong512K, in
``data/doc_lengths.json``, picked by total length as the paper does) and the MagiAttention CP
benchmark's ChatQA one (its sampler splits documents over a quarter of the pack:
``max_doc_fraction=0.25``). Documents are drawn in vectorised chunks until the total is reached;
the last is cut to fit, so lengths sum exactly to the total.

Choices where the paper's code is ambiguous, made explicit here:
  * a bin ``[low, high)`` draws uniformly from ``max(low, 1) .. high - 1`` (the paper's code drew
    ``high`` too, against the bin's own definition);
  * ``auto`` uses Pile up to 12,288 tokens, ProLong64K up to 65,536 and ProLong512K above.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from lcab.masks.geometry import IntArray

#: Builtin histogram names: the paper's three (``auto`` escalates through them in this order),
#: then the MagiAttention CP benchmark's ChatQA lengths.
BUILTIN_HISTOGRAMS = ("pile", "prolong64k", "prolong512k", "chatqa")
#: Every value `sample_doc_lengths` accepts as ``source``.
DOC_SOURCES = ("auto", *BUILTIN_HISTOGRAMS, "long", "uniform", "fixed", "histogram_file")
#: ``auto`` thresholds (inclusive upper totals) for Pile and ProLong64K.
AUTO_LIMITS = {"pile": 12 * 1024, "prolong64k": 64 * 1024}


@dataclass(frozen=True)
class LengthHistogram:
    """Document-count histogram: bin b covers lengths ``[edges[b], edges[b+1])``."""

    name: str
    edges: IntArray
    probs: np.ndarray
    corpus: str = ""

    def sample(self, count: int, rng: np.random.Generator) -> IntArray:
        """Draw ``count`` document lengths (each >= 1)."""
        bins = rng.choice(len(self.probs), size=count, p=self.probs)
        low = np.maximum(self.edges[bins], 1)
        high = np.maximum(self.edges[bins + 1], low + 1)  # exclusive
        return rng.integers(low, high, dtype=np.int64)

    def mean_length(self, cap: int) -> float:
        """Expected length of one draw when lengths above ``cap`` count as ``cap``."""
        low = np.maximum(self.edges[:-1], 1).astype(np.float64)
        high = np.maximum(self.edges[1:] - 1, low)
        # E[min(U, cap)] for U uniform on the integers low..high, per bin.
        clipped_high = np.minimum(high, cap)
        below = np.clip(clipped_high - low + 1, 0, None)
        n = high - low + 1
        mean_below = np.where(below > 0, (low + np.maximum(clipped_high, low)) / 2, 0.0)
        per_bin = (below * mean_below + (n - below) * cap) / n
        return float(np.dot(self.probs, per_bin))


def _parse_histogram(name: str, spec: Mapping[str, Any], where: str) -> LengthHistogram:
    """Validate one histogram entry (lcab format, or LongCA-style ``bins`` triples)."""
    if "bins" in spec:
        bins = spec["bins"]
        if (
            not isinstance(bins, list)
            or not bins
            or not all(isinstance(b, (list, tuple)) and len(b) == 3 for b in bins)
        ):
            raise ValueError(
                f"{where}: histogram {name!r}: 'bins' must be a list of [low, high, weight]"
            )
        edges_list = [bins[0][0]] + [b[1] for b in bins]
        if any(bins[i][1] != bins[i + 1][0] for i in range(len(bins) - 1)):
            raise ValueError(
                f"{where}: histogram {name!r}: bins must be contiguous ([a,b) then [b,c))"
            )
        weights_list = [b[2] for b in bins]
    else:
        if "edges" not in spec or "weights" not in spec:
            raise ValueError(
                f"{where}: histogram {name!r} needs 'edges' and 'weights' (or 'bins'); "
                f"got keys {sorted(spec)}"
            )
        edges_list, weights_list = spec["edges"], spec["weights"]
    try:
        edges = np.asarray(edges_list, dtype=np.float64)
        weights = np.asarray(weights_list, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: histogram {name!r}: edges and weights must be numbers") from err
    if edges.ndim != 1 or weights.ndim != 1 or len(edges) != len(weights) + 1 or len(weights) == 0:
        raise ValueError(
            f"{where}: histogram {name!r}: need len(edges) == len(weights) + 1 >= 2; "
            f"got {edges.size} edges and {weights.size} weights"
        )
    if not (np.all(np.isfinite(edges)) and np.all(edges == np.round(edges)) and edges[0] >= 0):
        raise ValueError(f"{where}: histogram {name!r}: edges must be non-negative integers")
    if not np.all(np.diff(edges) > 0):
        raise ValueError(f"{where}: histogram {name!r}: edges must be strictly increasing")
    if not np.all(np.isfinite(weights)) or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"{where}: histogram {name!r}: weights must be finite, >= 0 and not all 0")
    if edges[-1] < 2:
        raise ValueError(f"{where}: histogram {name!r}: the last edge must be >= 2 (lengths >= 1)")
    return LengthHistogram(
        name=name,
        edges=edges.astype(np.int64),
        probs=weights / weights.sum(),
        corpus=str(spec.get("corpus", "")),
    )


def load_histograms(path: str | Path) -> dict[str, LengthHistogram]:
    """Read a histogram file: ``{"histograms": {name: {"edges": [...], "weights": [...]}}}``.

    Each entry may instead give ``"bins": [[low, high, weight], ...]`` (the shared data format).

    Raises ValueError: the file is not JSON or an entry is malformed (the message names it).
    """
    where = str(path)
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"histogram file {where} cannot be read: {err}") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"histogram file {where} is not valid JSON: {err}") from err
    table = raw.get("histograms") if isinstance(raw, dict) else None
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{where}: expected an object with a non-empty 'histograms' mapping")
    out = {}
    for name, spec in table.items():
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: histogram {name!r} must be an object")
        out[name] = _parse_histogram(name, spec, where)
    return out


@cache
def builtin_histograms() -> dict[str, LengthHistogram]:
    """The packaged Pile / ProLong64K / ProLong512K histograms."""
    ref = resources.files("lcab.masks") / "data" / "doc_lengths.json"
    with resources.as_file(ref) as path:
        return load_histograms(path)


def auto_source(total: int) -> str:
    """The histogram the paper uses for a pack of ``total`` tokens."""
    for name, limit in AUTO_LIMITS.items():
        if total <= limit:
            return name
    return "prolong512k"


def pack(total: int, draw: Callable[[int], IntArray], mean_length: float) -> IntArray:
    """Draw documents in chunks until they cover ``total``; cut the last one to fit."""
    chunks: list[IntArray] = []
    covered = 0
    while covered < total:
        need = total - covered
        count = math.ceil(1.25 * need / max(mean_length, 1.0)) + 8
        chunk = draw(count)
        chunks.append(chunk)
        covered += int(chunk.sum())
    lengths = np.concatenate(chunks)
    ends = np.cumsum(lengths)
    n = int(np.searchsorted(ends, total, side="left")) + 1
    lengths = lengths[:n].copy()
    lengths[-1] -= int(ends[n - 1]) - total
    return lengths


def sample_doc_lengths(
    total: int,
    rng: np.random.Generator,
    *,
    source: str = "auto",
    doc_len: int = 1024,
    min_doc_len: int = 256,
    max_doc_len: int = 4096,
    long_fraction: float = 0.6,
    long_min_len: int = 8 * 1024,
    long_max_len: int = 30 * 1024,
    histogram_file: str | None = None,
    histogram_name: str | None = None,
    max_doc_fraction: float | None = None,
) -> IntArray:
    """Lengths of the documents packed into ``total`` tokens (they sum exactly to ``total``).

    The parameters are `lcab.masks.patterns.base.DocParams`' (``source`` is its doc_source).
    ``long`` is the paper's CP mix: ``long_fraction`` of the tokens from documents uniform in
    ``[long_min_len, long_max_len]``, the rest from the ``auto`` histogram, shuffled together;
    ``max_doc_fraction`` splits longer documents (`split_long_documents`).

    Raises ValueError: an unknown source or a parameter out of range (named in the message).
    """
    if total <= 0:
        raise ValueError(f"total={total} must be >= 1")
    if source not in DOC_SOURCES:
        raise ValueError(f"doc_source={source!r} is unknown; valid: {', '.join(DOC_SOURCES)}")
    if max_doc_fraction is not None and not 0.0 < max_doc_fraction <= 1.0:
        raise ValueError(f"max_doc_fraction={max_doc_fraction} must be in (0, 1]")

    def draw() -> IntArray:
        if source == "fixed":
            if doc_len < 1:
                raise ValueError(f"doc_len={doc_len} must be >= 1")
            full, rest = divmod(total, doc_len)
            return np.array([doc_len] * full + ([rest] if rest else []), dtype=np.int64)
        if source == "uniform":
            if not 1 <= min_doc_len <= max_doc_len:
                raise ValueError(
                    f"uniform documents need 1 <= min_doc_len <= max_doc_len; "
                    f"got min_doc_len={min_doc_len}, max_doc_len={max_doc_len}"
                )
            return pack(
                total,
                lambda n: rng.integers(min_doc_len, max_doc_len + 1, size=n, dtype=np.int64),
                min((min_doc_len + max_doc_len) / 2, total),
            )
        if source == "long":
            if not 0.0 <= long_fraction <= 1.0:
                raise ValueError(f"long_fraction={long_fraction} must be in [0, 1]")
            if not 1 <= long_min_len <= long_max_len:
                raise ValueError(
                    f"long documents need 1 <= long_min_len <= long_max_len; got "
                    f"long_min_len={long_min_len}, long_max_len={long_max_len}"
                )
            short_total = total - round(long_fraction * total)
            parts = []
            if short_total:
                parts.append(
                    _from_histogram(short_total, rng, builtin_histograms()[auto_source(total)])
                )
            if total - short_total:
                parts.append(
                    pack(
                        total - short_total,
                        lambda n: rng.integers(
                            long_min_len, long_max_len + 1, size=n, dtype=np.int64
                        ),
                        (long_min_len + long_max_len) / 2,
                    )
                )
            lengths = np.concatenate(parts)
            return lengths[rng.permutation(len(lengths))]
        if source == "histogram_file":
            if not histogram_file:
                raise ValueError("doc_source='histogram_file' needs histogram_file=<path to JSON>")
            table = load_histograms(histogram_file)
            chosen = histogram_name
            if chosen is None:
                if len(table) != 1:
                    raise ValueError(
                        f"{histogram_file} holds {len(table)} histograms; choose one with "
                        f"histogram_name (valid: {', '.join(table)})"
                    )
                chosen = next(iter(table))
            if chosen not in table:
                raise ValueError(
                    f"histogram_name={chosen!r} is not in {histogram_file}; "
                    f"valid: {', '.join(table)}"
                )
            return _from_histogram(total, rng, table[chosen])
        name = auto_source(total) if source == "auto" else source
        return _from_histogram(total, rng, builtin_histograms()[name])

    lengths = draw()
    if max_doc_fraction is None:
        return lengths
    return split_long_documents(lengths, max(1, int(max_doc_fraction * total)), rng)


def split_long_documents(lengths: IntArray, cap: int, rng: np.random.Generator) -> IntArray:
    """Split every document longer than ``cap`` into ``cap``-long pieces and its remainder.

    The pieces become separate documents and all are shuffled (lengths still sum to the total).
    """
    if cap < 1:
        raise ValueError(f"cap={cap} must be >= 1")
    if int(lengths.max(initial=0)) <= cap:
        return lengths
    full, rest = np.divmod(lengths, cap)
    pieces = np.concatenate([np.full(int(full.sum()), cap, dtype=np.int64), rest[rest > 0]])
    return pieces[rng.permutation(len(pieces))]


def _from_histogram(total: int, rng: np.random.Generator, hist: LengthHistogram) -> IntArray:
    return pack(total, lambda n: hist.sample(n, rng), hist.mean_length(total))


def check_doc_lengths(lengths: Any, total: int) -> IntArray:
    """Validate user-given document lengths: positive integers summing to ``total``."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"doc_lengths must be a non-empty list of integers; got {lengths!r}")
    if (arr <= 0).any() or int(arr.sum()) != total:
        raise ValueError(
            f"doc_lengths must be >= 1 each and sum to seqlen={total}; "
            f"got {arr.size} lengths summing to {int(arr.sum())}"
        )
    return arr.astype(np.int64)
