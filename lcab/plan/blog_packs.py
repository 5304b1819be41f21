"""The document packs behind the published H100 context-parallel figures, drawn again here.

The MagiAttention CP benchmark (``exps/dist_attn``: ``benchmark/utils.py`` ``DatasetSampler``,
``benchmark/mask.py`` ``MaskIterator``, ``benchmark_conf.py``) measured its document cells on
the first 20 packs of one deterministic sampler, the same packs for every strategy and pass.
Its rules, restated (the code is theirs; this is written from the description):

1. every document of the ChatQA histogram's bin ``[a, b]`` has length ``(a + b) // 2`` (the bin's
   midpoint), as many as the bin counts;
2. each length is cut into pieces of ``chunk = pack_len * 0.25`` and a remainder — full pieces
   first, then the remainders in bin order — and the pieces are shuffled (``numpy`` generator
   seeded 42, one ``shuffle`` of the int32 array);
3. the shuffled pieces are laid end to end and the stream is cut every ``pack_len`` tokens (a
   piece across a cut continues in the next pack; the incomplete last pack is dropped);
4. the list of packs is shuffled by the same generator, and the benchmark takes the first 20.

A document cell's throughput varies several-fold between packs, so the comparison uses these
packs rather than others drawn from the histogram — the same ones only if the benchmark's NumPy
drew the same two shuffles (NumPy does not promise a ``Generator``'s stream across versions).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

import numpy as np

#: The benchmark's sampler settings (benchmark_conf.py SAMPLE_CONFIG and SEED).
SEED = 42
CHUNK_RATIO = 0.25
PACKS = 20


def chatqa_documents() -> tuple[np.ndarray, np.ndarray]:
    """(length, count) per ChatQA bin: each bin's midpoint, as the benchmark's sampler reads it.

    lcab stores the benchmark's inclusive bins ``[a, b]`` as ``[a, b + 1)`` with raw counts.
    """
    ref = resources.files("lcab.masks") / "data" / "doc_lengths.json"
    entry = json.loads(ref.read_text())["histograms"]["chatqa"]
    edges = np.asarray(entry["edges"], dtype=np.int64)
    lengths = (edges[:-1] + edges[1:] - 1) // 2
    return lengths.astype(np.int32), np.asarray(entry["weights"], dtype=np.int64)


def sampler_pieces(lengths: np.ndarray, counts: np.ndarray, chunk: float) -> np.ndarray:
    """Every document cut into ``chunk``-long pieces and its remainder, unshuffled (rule 2)."""
    whole = (lengths // chunk).astype(np.int64) * counts
    full = np.full(int(whole.sum()), int(chunk), dtype=np.int32)
    rest = (lengths % chunk).astype(np.int32)
    keep = rest > 0
    return np.concatenate([full, np.repeat(rest[keep], counts[keep])]).astype(np.int32)


def packs_from(
    lengths: np.ndarray, counts: np.ndarray, pack_len: int, seed: int = SEED, take: int = PACKS
) -> list[list[int]]:
    """The first ``take`` packs of ``pack_len`` tokens the benchmark's sampler makes (rules 1–4).

    Cutting the stream of pieces at every multiple of ``pack_len`` is what packing them one by
    one with a carried-over remainder does, so only the packs taken are built.
    """
    rng = np.random.default_rng(seed)
    pieces = sampler_pieces(lengths, counts, pack_len * CHUNK_RATIO)
    rng.shuffle(pieces)
    ends = np.cumsum(pieces, dtype=np.int64)
    order = list(range(int(ends[-1]) // pack_len))
    rng.shuffle(order)  # the benchmark shuffles its list of packs; same draws, same order
    packs = []
    for k in order[:take]:
        start, stop = k * pack_len, (k + 1) * pack_len
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop, side="left"))
        cuts = np.concatenate([[start], ends[first:last], [stop]])
        packs.append([int(n) for n in np.diff(cuts) if n > 0])
    return packs


@cache
def blog_packs(pack_len: int) -> tuple[tuple[int, ...], ...]:
    """The 20 ChatQA packs of ``pack_len`` tokens the published document cells were measured on."""
    lengths, counts = chatqa_documents()
    return tuple(tuple(p) for p in packs_from(lengths, counts, pack_len))
