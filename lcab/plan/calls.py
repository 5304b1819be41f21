"""One kernel call of a replayed step: its work, and the copies its implementation makes.

A shard pair becomes the `Work` of one call: its attended area and counts (`lcab.plan.areas`)
and the memory passes the harness makes around it; plus the copies made apart from calls, once
a ring step's transfer has arrived (`accumulate_work`) and after the whole ring (`merge_work`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lcab.cp.base import Plan, accumulator_bytes, element_bytes
from lcab.kernels import Problem
from lcab.masks.core import AttnMask
from lcab.masks.geometry import kind_bands
from lcab.plan.areas import PairWork
from lcab.plan.harness import Copies, Elements, Harness
from lcab.plan.steps import Work, dense_rectangle


@dataclass(frozen=True)
class Call:
    """Where a call runs: the family whose copies surround it and its token counts."""

    family: str
    """ulysses | allgather | ring (the harness's passes per call)."""
    harness: Harness
    q_tokens: int
    kv_tokens: int
    documents: int = 1
    """Documents of the mask (the sequences of a call that lists every one)."""
    half: str = ""
    """The half a causal ring step extracts and calls with (q | kv; "" for none)."""


Figures = tuple[float, float, float, float, float, float, float, float, float, float]
"""A call's pair figures: (area, mean keys, rows, runs, mean queries, cols, key documents,
longest cols, diagonal rows, diagonal runs), averaged over the mask heads of its Ulysses member
(`figures_of`)."""


def figures_of(works: PairWork, mask_heads: Sequence[int], local_q: int, i: int, j: int) -> Figures:
    """The figures of pair (i, j) for the mask heads a Ulysses member computes.

    The area is per local query head (the per-KV-head masks' mean, times the query heads).
    """
    area = sum(works.area[h, i, j] for h in mask_heads) * local_q / len(mask_heads)
    return (
        area,
        _head_mean(works.mean_keys, mask_heads, i, j),
        _head_mean(works.rows, mask_heads, i, j),
        _head_mean(works.runs, mask_heads, i, j),
        _head_mean(works.mean_queries, mask_heads, i, j),
        _head_mean(works.cols, mask_heads, i, j) if works.cols is not None else 0.0,
        _head_mean(works.col_docs, mask_heads, i, j) if works.col_docs is not None else 0.0,
        _head_mean(works.longest_cols, mask_heads, i, j) if works.longest_cols is not None else 0.0,
        _head_mean(works.diagonal_rows, mask_heads, i, j)
        if works.diagonal_rows is not None
        else 0.0,
        _head_mean(works.diagonal_runs, mask_heads, i, j)
        if works.diagonal_runs is not None
        else 0.0,
    )


def _call_copies(call: Call, bwd: bool) -> Copies:
    """The copies around ``call`` in one pass: the family's, plus its half's extraction."""
    return call.harness.call_passes(call.family, bwd).plus(call.harness.half_passes(call.half, bwd))


def work_of(
    figures: Figures, plan: Plan, problem: Problem, bwd: bool, call: Call, copies: Copies
) -> Work:
    """The `Work` of a call with pair ``figures`` (area > 0) and the copies around it."""
    heads = plan.heads
    area, keys, rows, runs, queries, cols, key_docs, longest, diagonal, diagonal_runs = figures
    sequences = call.documents if call.harness.lists_every_document else key_docs
    if call.harness.kernel_gets_active_tokens and key_docs > 0:
        # packed varlen input: a document's rows in the call are one sequence, one run of
        # tiles, however many zigzag chunks of the padded layout they came from
        runs = key_docs
    factor = 2.5 if bwd else 1.0
    # copies outside the kernel: layouts, padding, merges of partials, gradient accumulation
    q_size, kv_size = heads.local_q * problem.head_dim, heads.local_kv * problem.head_dim
    elements = Elements(
        call.q_tokens * q_size, call.kv_tokens * kv_size, rows * q_size, cols * kv_size
    )
    moved = copies.bytes(elements, element_bytes(problem), accumulator_bytes(problem))
    q_per_kv = heads.local_q / max(heads.local_kv, 1)
    flops = 4.0 * area * problem.head_dim * factor
    active = call.harness.kernel_gets_active_tokens
    dense_rows, dense_keys = dense_rectangle(
        area / max(heads.local_q, 1),
        rows if active else call.q_tokens,
        cols if active and cols > 0 else call.kv_tokens,
    )
    return Work(
        flops,
        keys,
        rows,
        runs,
        moved.total,
        q_per_kv,
        queries,
        gather_bytes=moved.gathers,
        scatter_bytes=moved.scatters,
        q_elements=elements.active_q if call.harness.kernel_gets_active_tokens else elements.q,
        kv_elements=elements.active_kv if call.harness.kernel_gets_active_tokens else elements.kv,
        q_row_elements=q_size,
        kv_row_elements=kv_size,
        q_heads=heads.local_q,
        sequences=sequences,
        key_columns=cols,
        key_documents=key_docs,
        key_runs=key_docs,
        longest_keys=longest,
        diagonal_rows=diagonal,
        diagonal_runs=diagonal_runs,
        head_dim=problem.head_dim,
        dense_rows=dense_rows,
        dense_keys=dense_keys,
    )


class CallWorks:
    """The work of each call of one replay (one plan, problem and pair table), memoised.

    A 96-rank replay asks for ~18,000 calls per pass, most of them alike. A one-head mask's
    figures are read for all pairs at once, and calls with equal figures share one `Work`
    object, so the cost model costs each distinct call once.
    """

    def __init__(self, works: PairWork, plan: Plan, problem: Problem) -> None:
        self.works, self.plan, self.problem = works, plan, problem
        self._table: list[list[Figures]] | None = None
        if works.area.shape[0] == 1:
            self._table = _figure_table(works, plan.heads.local_q)
        self._calls: dict[tuple[int, bool], PerCall] = {}

    def __call__(self, ui: int, i: int, j: int, bwd: bool, call: Call) -> Work | None:
        """The call of Ulysses member ``ui`` on pair (i, j); None when the pair attends nothing."""
        return self.step(self.per_call(call, bwd), ui, i, j)[0]

    def per_call(self, call: Call, bwd: bool) -> PerCall:
        """What is memoised for ``call`` in one pass (the replay holds it over its steps)."""
        per = self._calls.get((id(call), bwd))
        if per is None:
            per = self._calls[id(call), bwd] = PerCall(call, bwd, _call_copies(call, bwd))
        return per

    def step(self, per: PerCall, ui: int, i: int, j: int) -> tuple[Work | None, tuple[Work, ...]]:
        """(its work, `accumulate_work`) of ``per``'s call by member ``ui`` on pair (i, j)."""
        if self._table is not None:
            figures = self._table[i][j]
        else:
            heads = self.plan.heads.kv_heads_of(ui)
            figures = figures_of(self.works, heads, self.plan.heads.local_q, i, j)
        if figures[0] <= 0:
            return None, ()
        work = per.works.get(figures)
        if work is None:
            work = per.works[figures] = work_of(
                figures, self.plan, self.problem, per.bwd, per.call, per.copies
            )
        if per.finish is None:  # the same for every call that computes anything
            harness = per.call.harness
            per.finish = accumulate_work(work, per.call, self.plan, self.problem, harness, per.bwd)
        return work, per.finish


@dataclass
class PerCall:
    """What `CallWorks` keeps for one call in one pass (the call is kept: its id is its key)."""

    call: Call
    bwd: bool
    copies: Copies
    works: dict[Figures, Work] = field(default_factory=dict)
    """One `Work` per distinct figures."""
    finish: tuple[Work, ...] | None = None
    """`accumulate_work` of a call that computes anything (None: not asked yet)."""


def _figure_table(works: PairWork, local_q: int) -> list[list[Figures]]:
    """`figures_of` of every pair of a one-head mask, as Python floats, row by row.

    Element-wise numpy arithmetic is IEEE arithmetic on each element, so every figure is the
    one `figures_of` computes for the pair.
    """

    def plane(values: np.ndarray | None) -> list[list[float]]:
        if values is None:
            values = np.zeros((1, *works.area.shape[1:]))
        rows: list[list[float]] = np.asarray(values[0], dtype=np.float64).tolist()
        return rows

    area = np.asarray((0 + works.area[0]) * local_q / 1, dtype=np.float64).tolist()
    planes = [
        area,
        plane(works.mean_keys),
        plane(works.rows),
        plane(works.runs),
        plane(works.mean_queries),
        plane(works.cols),
        plane(works.col_docs),
        plane(works.longest_cols),
        plane(works.diagonal_rows),
        plane(works.diagonal_runs),
    ]
    return [list(zip(*(p[i] for p in planes), strict=True)) for i in range(len(area))]


def attends_only_past(mask: AttnMask) -> bool:
    """Every attended key is at or before its query (what the published code calls causal)."""
    q0, _, _, k1, _ = mask.slices.T
    _, hi = kind_bands(*mask.slices.T)
    return bool((np.minimum(hi, k1 - 1 - q0) <= 0).all())


def ring_calls_halves(harness: Harness, balancer: str, mask: AttnMask) -> bool:
    """Whether ``harness``'s ring steps extract and call with halves (`causal_half`).

    On a mask that attends only the past, placed by zigzag, with code that does (the published).
    """
    return harness.causal_halves and balancer == "zigzag" and attends_only_past(mask)


def causal_half(position: int, source: int) -> str:
    """The half a zigzag ring step on a causal mask calls with, extracted first (q | kv | "").

    Ring position ``position`` holding the K/V of ``source``: its own K/V need the whole call;
    an earlier position's K/V are attended only through their first half ("kv"), and a later
    position's only by the second half of the queries ("q") — the published
    ``FA3RingAttnFunc``'s ``is_half_kv`` / ``is_half_q``.
    """
    if source == position:
        return ""
    return "kv" if source < position else "q"


def documents_of(mask: AttnMask) -> int:
    """Documents of ``mask`` (1 when it has none)."""
    return max(len(mask.doc_lengths), 1) if mask.doc_lengths is not None else 1


def _head_mean(values: np.ndarray, mask_heads: Sequence[int], i: int, j: int) -> float:
    """Mean of ``values[h, i, j]`` over the mask heads a Ulysses member computes."""
    if len(mask_heads) == 1:  # the common case, read without a numpy reduction (hot path)
        return float(values[mask_heads[0], i, j])
    return float(np.mean(values[list(mask_heads), i, j]))


def copies_work(copies: Copies, elements: Elements, problem: Problem) -> Work:
    """Copies made outside any kernel call (around all-to-alls, once per pass) as work."""
    moved = copies.bytes(elements, element_bytes(problem), accumulator_bytes(problem))
    return Work(
        0.0,
        0.0,
        memory_bytes=moved.total,
        gather_bytes=moved.gathers,
        scatter_bytes=moved.scatters,
    )


def merge_work(
    calls: list[Call], plan: Plan, problem: Problem, harness: Harness, bwd: bool
) -> Work | None:
    """The harness's merge of every ring step's partial result, run after the last step.

    Its passes run over each step's tensors (a causal step's half, where it calls with one),
    plus once over the whole local ones; None when the harness merges within each step.
    """
    passes = harness.merge_passes(bwd)
    if passes is None:
        return None
    per_step, once = passes
    q_size = plan.heads.local_q * problem.head_dim
    kv_size = plan.heads.local_kv * problem.head_dim
    tokens = plan.shard_len * plan.ulysses
    steps = Elements(
        sum(c.q_tokens for c in calls) * q_size, sum(c.kv_tokens for c in calls) * kv_size, 0, 0
    )
    whole = Elements(tokens * q_size, tokens * kv_size, 0.0, 0.0)
    return sum_copies(copies_work(per_step, steps, problem), copies_work(once, whole, problem))


def accumulate_work(
    work: Work | None, call: Call, plan: Plan, problem: Problem, harness: Harness, bwd: bool
) -> tuple[Work, ...]:
    """The harness's copies of a ring step that wait for the step's transfer (none: ``()``).

    They run over the step's key-sized tensors (the half a causal step calls with), for a step
    that computes anything.
    """
    passes = harness.accumulate_passes(bwd)
    if passes is None or work is None:
        return ()
    kv = call.kv_tokens * plan.heads.local_kv * problem.head_dim
    return (copies_work(passes, Elements(0.0, kv, 0.0, 0.0), problem),)


def sum_copies(a: Work, b: Work) -> Work:
    """Two works of copies (no attention) as one."""
    return Work(
        0.0,
        0.0,
        memory_bytes=a.memory_bytes + b.memory_bytes,
        gather_bytes=a.gather_bytes + b.gather_bytes,
        scatter_bytes=a.scatter_bytes + b.scatter_bytes,
    )
