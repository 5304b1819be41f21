"""Load balance of context-parallel placements, from the plans alone (no attention is run).

A rank's compute is the attended area of its query rows, so max / mean area over ranks bounds
the step time against a balanced run. Targets: ``area`` imbalance <= 1.05 on ``causal`` and
``causal_document`` at 8 ranks (ProLong512K documents at S = 131,072); ``zigzag`` (the paper's)
is the anchor to match, at less padding.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from lcab.cp.balance import BALANCERS, place
from lcab.masks import make_mask

SEQLEN = 131072
SHARDS = (8, 96)
#: (mask, seeds); masks without random documents need a single seed.
MASKS: tuple[tuple[str, int], ...] = (
    ("causal", 1),
    ("causal_document", 30),
    ("share_question", 30),
    ("sliding_window_causal", 1),
    ("block_causal_document", 30),
)
#: (mask, shards) -> largest allowed ``area`` imbalance.
TARGETS = {("causal", 8): 1.05, ("causal_document", 8): 1.05}


@dataclass(frozen=True)
class BalanceRow:
    """Imbalance and padding of one balancer on one mask over seeds (or why it cannot run)."""

    mask: str
    shards: int
    balancer: str
    seeds: int
    imbalances: tuple[float, ...] = ()
    padding: tuple[int, ...] = ()
    reason: str = ""


def measure_balance(mask_name: str, seqlen: int, shards: int, seeds: int) -> list[BalanceRow]:
    """One row per balancer: imbalance and padding over masks drawn with seeds 0..seeds-1."""
    imbalances: dict[str, list[float]] = {b: [] for b in BALANCERS}
    padding: dict[str, list[int]] = {b: [] for b in BALANCERS}
    reasons: dict[str, str] = {}
    for seed in range(seeds):
        mask = make_mask(mask_name, seqlen, seed=seed)
        for balancer in BALANCERS:
            if balancer in reasons:
                continue
            try:
                placement = place(mask, shards, balancer)
            except ValueError as err:  # a balancer may refuse a mask: report, don't crash
                reasons[balancer] = str(err).splitlines()[0]
                continue
            imbalances[balancer].append(placement.imbalance(mask))
            padding[balancer].append(placement.padding_tokens)
    return [
        BalanceRow(
            mask_name,
            shards,
            b,
            seeds,
            tuple(imbalances[b]),
            tuple(padding[b]),
            reasons.get(b, ""),
        )
        for b in BALANCERS
    ]


def _format(row: BalanceRow) -> str:
    head = f"{row.mask:22s} {row.shards:>4d} {row.balancer:11s} {row.seeds:>5d}"
    if row.reason:
        return f"{head}  refused: {row.reason}"
    med = statistics.median(row.imbalances)
    lo, hi = min(row.imbalances), max(row.imbalances)
    pad = statistics.median(row.padding)
    line = f"{head}  {med:8.4f}  {lo:7.4f}  {hi:7.4f}  {pad:>9,.0f}"
    target = TARGETS.get((row.mask, row.shards))
    if target is not None and row.balancer == "area":
        verdict = "ok" if med <= target else "MISSED"
        over = sum(value > target for value in row.imbalances)
        line += f"  target <= {target:.2f}: median {verdict}, {over}/{row.seeds} seeds above"
    elif row.balancer == "zigzag":
        line += "  (anchor)"
    return line


def run() -> None:
    """Print the balance table for every mask, shard count and balancer."""
    start = time.perf_counter()
    print(f"== CP load balance from placements, S = {SEQLEN:,} (imbalance = max/mean area) ==")
    print("documents: doc_source=auto (ProLong512K at this S); padding = median padded tokens")
    header = (
        f"{'mask':22s} {'rank':>4s} {'balancer':11s} {'seeds':>5s}"
        f"  {'median':>8s}  {'min':>7s}  {'max':>7s}  {'padding':>9s}"
    )
    print(header)
    print("-" * len(header))
    for shards in SHARDS:
        for mask_name, seeds in MASKS:
            for row in measure_balance(mask_name, SEQLEN, shards, seeds):
                print(_format(row))
        print()
    print(f"total {time.perf_counter() - start:.1f} s")
