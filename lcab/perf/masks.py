"""Mask-engine speed: building masks, counting areas and lowering them (FlexAttention above all).

Targets: ``causal_document`` at S = 1,048,576 built and its area counted in <= 50 ms,
S = 4,194,304 in <= 200 ms, cost linear in the number of documents; the Flex BlockMask from
slices at S = 65,536 at least 10x faster than ``create_block_mask`` on an equivalent mask_mod.
Every lowering (varlen, FlashMask, FFA, block table, Flex BlockMask) of a 1M-token mask in
<= 100 ms, so a paper-scale sweep never waits on host-side mask preparation.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from lcab.masks import AttnMask, make_mask
from lcab.masks.lowering import (
    NotExpressible,
    block_table,
    flex_block_mask,
    to_ffa,
    to_flashmask,
    to_varlen,
)


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def median_ms(samples: list[float]) -> float:
    """Median of second samples, in milliseconds."""
    return statistics.median(samples) * 1e3


def _build_and_area(seqlen: int, seed: int, **params: object) -> int:
    return make_mask("causal_document", seqlen, seed=seed, **params).area()


def build_and_area(seqlen: int, seeds: int) -> tuple[float, float, float]:
    """(median ms, max ms, median docs) of make_mask + area() over ``seeds`` seeds."""
    times: list[float] = []
    docs: list[int] = []
    for seed in range(seeds):
        times.extend(time_calls(partial(_build_and_area, seqlen, seed), 1, warmup=0))
        docs.append(make_mask("causal_document", seqlen, seed=seed).num_docs or 0)
    return median_ms(times), max(times) * 1e3, float(statistics.median(docs))


def scaling_with_documents(seqlen: int) -> list[tuple[int, float]]:
    """(documents, median ms) for fixed-length documents at one total length."""
    rows = []
    for doc_len in (65536, 4096, 256, 16):
        fn = partial(_build_and_area, seqlen, 0, doc_source="fixed", doc_len=doc_len)
        rows.append((seqlen // doc_len, median_ms(time_calls(fn, 5))))
    return rows


def flex_comparison(seqlen: int) -> tuple[float, float | None, str]:
    """(ours ms, create_block_mask ms or None, note) for causal_document at ``seqlen``."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask = make_mask("causal_document", seqlen, seed=0)
    ours = median_ms(time_calls(lambda: flex_block_mask(mask), 7))
    lengths = mask.doc_lengths
    assert lengths is not None
    doc_id = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths))

    def document_causal(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return (doc_id[q_idx] == doc_id[kv_idx]) & (kv_idx <= q_idx)

    note = "create_block_mask(_compile=True), warm (after one compiling call)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            samples = time_calls(
                lambda: create_block_mask(
                    document_causal, None, None, seqlen, seqlen, device="cpu", _compile=True
                ),
                3,
                warmup=1,
            )
        theirs: float | None = median_ms(samples)
    except (RuntimeError, MemoryError) as err:  # eager needs Sq*Sk bytes; compiled may too
        theirs, note = None, f"create_block_mask failed: {str(err).splitlines()[0][:80]}"
    return ours, theirs, note


#: Lowerings timed at paper scale, and the per-call target for each.
LOWERINGS: dict[str, Callable[[AttnMask], object]] = {
    "varlen (cu_seqlens)": to_varlen,
    "flashmask (columns)": to_flashmask,
    "ffa (ranges)": to_ffa,
    "block_table (128x128)": lambda mask: block_table(mask, 128),
    "flex BlockMask (128)": flex_block_mask,
}
LOWERING_TARGET_MS = 100.0
LOWERING_PATTERNS = ("causal_document", "causal", "sliding_window")


def lowering_times(seqlen: int, repeats: int = 3) -> list[tuple[str, str, float | None]]:
    """(pattern, lowering, median ms or None if not expressible) at ``seqlen``, seed 0."""
    rows: list[tuple[str, str, float | None]] = []
    for pattern in LOWERING_PATTERNS:
        mask = make_mask(pattern, seqlen, seed=0)
        for name, fn in LOWERINGS.items():
            try:
                ms: float | None = median_ms(time_calls(partial(fn, mask), repeats))
            except NotExpressible:
                ms = None
            rows.append((pattern, name, ms))
    return rows


def print_lowering_times(seqlen: int) -> None:
    """One row per (pattern, lowering): median ms and pass/fail against the target."""
    print(
        f"\n== lowerings at S = {seqlen:,}, median of 3 calls, "
        f"target <= {LOWERING_TARGET_MS:.0f} ms =="
    )
    for pattern, name, ms in lowering_times(seqlen):
        if ms is None:
            print(f"{pattern:16s} {name:24s} {'not expressible':>11s}")
            continue
        verdict = "pass" if ms <= LOWERING_TARGET_MS else "FAIL"
        print(f"{pattern:16s} {name:24s} {ms:8.2f} ms  {verdict}")


def run() -> None:
    """Print every mask-engine figure."""
    print("== causal_document: make_mask + area() (ProLong512K lengths), 30 seeds ==")
    for seqlen, target in ((1 << 20, 50.0), (1 << 22, 200.0)):
        med, worst, docs = build_and_area(seqlen, 30)
        print(
            f"S={seqlen:>9,}  median {med:7.2f} ms  max {worst:7.2f} ms  "
            f"(median {docs:,.0f} docs)  target <= {target:.0f} ms"
        )
    print("\n== cost vs number of documents (fixed lengths, S = 1,048,576) ==")
    for docs, ms in scaling_with_documents(1 << 20):
        print(f"{docs:>8,} docs  {ms:8.2f} ms  ({ms / docs * 1e3:7.3f} us per doc)")
    print_lowering_times(1 << 20)
    print("\n== FlexAttention BlockMask for causal_document at S = 65,536 ==")
    ours, theirs, note = flex_comparison(1 << 16)
    print(f"lcab flex_block_mask (from slices)   {ours:9.2f} ms")
    if theirs is None:
        print(note)
    else:
        print(f"{note:36s} {theirs:9.2f} ms")
        print(f"speed-up: {theirs / ours:.0f}x  (target >= 10x)")
