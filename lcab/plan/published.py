"""The published H100 context-parallel figures the planner is checked against.

Per-GPU TFLOP/s (max-rank-time convention) of Ulysses, Ring P2P, Ring All-Gather, USP and
LoongTrain at cp = 8 / 16 / 32 / 64, H100, 8K tokens per GPU, GQA 64:8, head dim 128, bf16, FA3
as the local kernel — read by eye (±10) from the MagiAttention cp_benchmark blog charts, as
transcribed in ``../shared/reference/paper_digest.md`` §8.3 (the LongCA-bench paper gives no
numbers for its CP figures). Facts, not code: the planner never reads them to set a parameter.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import combinations
from multiprocessing import get_context

import numpy as np

from lcab.plan.blog_packs import PACKS, blog_packs
from lcab.plan.hardware import Hardware
from lcab.plan.harness import LONGCA
from lcab.plan.predict import PlanCell, mask_for, predict

CP_SIZES = (8, 16, 32, 64)
STRATEGY_ORDER = ("ulysses", "ring", "ring_allgather", "usp", "loongtrain")
#: (mask, pass) -> strategy -> TFLOP/s per GPU at CP_SIZES.
PUBLISHED: dict[tuple[str, str], dict[str, tuple[int, ...]]] = {
    ("full", "fwd"): {
        "ulysses": (605, 575, 583, 620),
        "ring": (511, 535, 516, 513),
        "ring_allgather": (605, 597, 590, 583),
        "usp": (580, 602, 594, 606),
        "loongtrain": (578, 601, 596, 604),
    },
    ("causal", "fwd"): {
        "ulysses": (602, 557, 581, 585),
        "ring": (420, 455, 452, 447),
        "ring_allgather": (601, 590, 593, 583),
        "usp": (592, 588, 594, 587),
        "loongtrain": (594, 586, 583, 588),
    },
    ("full_document", "fwd"): {
        "ulysses": (389, 305, 284, 259),
        "ring": (159, 134, 92, 56),
        "ring_allgather": (386, 386, 323, 248),
        "usp": (373, 371, 373, 291),
        "loongtrain": (370, 372, 314, 292),
    },
    ("causal_document", "bwd"): {
        "ulysses": (332, 294, 276, 248),
        "ring": (97, 86, 57, 29),
        "ring_allgather": (179, 155, 104, 55),
        "usp": (324, 309, 284, 194),
        "loongtrain": (320, 253, 179, 171),
    },
}
#: Reading error of the charts: differences below twice this are not an ordering.
READING_ERROR = 10
#: The blog's document cells: each point the mean TFLOP/s of its sampler's first 20 packs
#: (`lcab.plan.blog_packs`: ChatQA lengths cut at 1/4 of the pack, seed 42) — the same packs here.
DOCUMENT_SAMPLES = PACKS


@dataclass(frozen=True)
class Comparison:
    """Predicted vs published per-GPU TFLOP/s of one (mask, pass, strategy, cp size)."""

    mask: str
    pass_: str
    cp: str
    world: int
    published: float
    predicted: float

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted / self.published - 1.0


def paper_cell(mask: str, cp: str, world: int, sample: int = 0) -> PlanCell:
    """The blog's setting for one cell: 8K tokens per GPU, 64:8 heads, d 128, 8 GPUs a node.

    Document masks hold pack ``sample`` of the blog's sampler for that length.
    """
    seqlen = 8192 * world
    params: dict = {}
    if "document" in mask:
        params = {"doc_lengths": list(blog_packs(seqlen)[sample])}
    return PlanCell(
        cp=cp,
        kernel="fa3",
        mask=mask,
        seqlen=seqlen,
        nodes=world // 8,
        devices_per_node=8,
        heads_q=64,
        heads_kv=8,
        head_dim=128,
        dtype="bfloat16",
        cp_options={} if cp == "ulysses" else {"balance": "zigzag"},
        mask_params=params,
    )


def compare(
    hardware: Hardware,
    worlds: Sequence[int] = CP_SIZES,
    samples: int = DOCUMENT_SAMPLES,
    workers: int | None = None,
) -> list[Comparison]:
    """Every published cell at ``worlds``, predicted on ``hardware``.

    Document cells average ``samples`` packs. Each (mask, pass, cp size) is independent, so
    they run in ``workers`` processes (None: one per CPU core; 1: in this process).
    """
    if not 1 <= samples <= PACKS:
        raise ValueError(f"samples={samples} must be in 1..{PACKS} (the blog's packs)")
    jobs = [(key, world, hardware, samples) for key in PUBLISHED for world in worlds]
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    if workers <= 1:
        return [row for job in jobs for row in _compare_one(*job)]
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        return [row for rows in pool.map(_compare_one, *zip(*jobs, strict=True)) for row in rows]


def _compare_one(
    key: tuple[str, str], world: int, hardware: Hardware, samples: int
) -> list[Comparison]:
    """The five strategies of one (mask, pass) at one cp size."""
    mask, pass_ = key
    per_strategy = PUBLISHED[key]
    tflops: dict[str, list[float]] = {cp: [] for cp in per_strategy}
    for sample in range(samples if "document" in mask else 1):
        built = mask_for(paper_cell(mask, "ulysses", world, sample))  # one mask, five plans
        for cp in per_strategy:
            theirs = predict(paper_cell(mask, cp, world, sample), hardware, built, LONGCA)
            tflops[cp].append(theirs.pass_(pass_).tflops)  # LONGCA: the code that was measured
    published = {cp: values[CP_SIZES.index(world)] for cp, values in per_strategy.items()}
    return [
        Comparison(mask, pass_, cp, world, published[cp], float(np.mean(tflops[cp])))
        for cp in per_strategy
    ]


def ordering_agreement(rows: list[Comparison]) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (mask, pass): (pairs ordered as published, pairs compared).

    Pairs are (strategy a, strategy b) at one cp size whose published values differ by more than
    twice the reading error; the prediction agrees when it orders them the same way.
    """
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for key in PUBLISHED:
        agree = total = 0
        for world in CP_SIZES:
            cells = {r.cp: r for r in rows if (r.mask, r.pass_) == key and r.world == world}
            for a, b in combinations(sorted(cells), 2):
                gap = cells[a].published - cells[b].published
                if abs(gap) <= 2 * READING_ERROR:
                    continue
                total += 1
                agree += int(np.sign(cells[a].predicted - cells[b].predicted) == np.sign(gap))
        out[key] = (agree, total)
    return out
