"""The planner's predictions beside the published H100 context-parallel figures.

Per-GPU TFLOP/s (max-rank-time convention) of Ulysses, Ring P2P, Ring All-Gather, USP and
LoongTrain at cp = 8 / 16 / 32 / 64, H100, 8K tokens per GPU, GQA 64:8, head dim 128, bf16, FA3
as the local kernel: the MagiAttention cp_benchmark blog's charts, read off their pixels (±3),
as `lcab.records.published` stores them (the LongCA-bench paper gives no numbers for its CP
figures). Facts, not code: the planner never reads them to set a parameter.
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
from lcab.records.published import Published, published

CP_SIZES = (8, 16, 32, 64)
SOURCE = "magi-cp-h100"
"""The published figures' source in `lcab.records.published`."""
CHECKED = (("full", "fwd"), ("causal", "fwd"), ("full_document", "fwd"), ("causal_document", "bwd"))
"""The (mask, pass) charts checked: the four the planner was first validated on (80 cells)."""
#: The blog's document cells: each point the mean TFLOP/s of its sampler's first 20 packs
#: (`lcab.plan.blog_packs`: ChatQA lengths cut at 1/4 of the pack, seed 42) — the same packs here.
DOCUMENT_SAMPLES = PACKS


def published_cells() -> dict[tuple[str, str], dict[str, dict[int, Published]]]:
    """(mask, pass) -> strategy -> cp size -> the published figure, for `CHECKED`."""
    out: dict[tuple[str, str], dict[str, dict[int, Published]]] = {key: {} for key in CHECKED}
    for p in published(SOURCE):
        if (p.mask, p.pass_) in out and p.world in CP_SIZES:
            out[(p.mask, p.pass_)].setdefault(p.cp, {})[p.world] = p
    return out


@dataclass(frozen=True)
class Comparison:
    """Predicted vs published per-GPU TFLOP/s of one (mask, pass, strategy, cp size)."""

    mask: str
    pass_: str
    cp: str
    world: int
    published: float
    predicted: float
    reading_error: float = 0.0
    """How far the published figure may be off, as read (`Published.error`)."""

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
    jobs = [(key, world, hardware, samples) for key in CHECKED for world in worlds]
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
    per_strategy = published_cells()[key]
    tflops: dict[str, list[float]] = {cp: [] for cp in per_strategy}
    for sample in range(samples if "document" in mask else 1):
        built = mask_for(paper_cell(mask, "ulysses", world, sample))  # one mask, five plans
        for cp in per_strategy:
            theirs = predict(paper_cell(mask, cp, world, sample), hardware, built, LONGCA)
            tflops[cp].append(theirs.pass_(pass_).tflops)  # LONGCA: the code that was measured
    figures = {cp: by_world[world] for cp, by_world in per_strategy.items()}
    return [
        Comparison(mask, pass_, cp, world, p.value, float(np.mean(tflops[cp])), p.error or 0.0)
        for cp, p in figures.items()
    ]


def ordering_agreement(rows: list[Comparison]) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (mask, pass): (pairs ordered as published, pairs compared).

    Pairs are (strategy a, strategy b) at one cp size whose published values differ by more than
    the two readings' errors together; the prediction agrees when it orders them the same way.
    """
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for key in CHECKED:
        agree = total = 0
        for world in CP_SIZES:
            cells = {r.cp: r for r in rows if (r.mask, r.pass_) == key and r.world == world}
            for a, b in combinations(sorted(cells), 2):
                gap = cells[a].published - cells[b].published
                if abs(gap) <= cells[a].reading_error + cells[b].reading_error:
                    continue
                total += 1
                agree += int(np.sign(cells[a].predicted - cells[b].predicted) == np.sign(gap))
        out[key] = (agree, total)
    return out
