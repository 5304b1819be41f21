"""A cell's schedule checked at its real world size, every rank's real code run in one process.

`record` runs each rank's real ``build`` and one forward and backward of its real code on small
shards, one rank after another, through `lcab.cp.schedule`; `check_schedule` holds the records to
`lcab.cp.schedule_rules`. Stood in for, as neither decides what is sent: the kernel (zeros of
the right shapes) and each block's sub-mask, of which the runner asks only whether it has work
(`lcab.cp.base.BLOCK_STAND_IN`: restricting costs ~1 ms a block; a 96-rank ring has 9,216).
`GRID_WORLDS` x `GRID_MASKS` x every strategy is what CI checks (`grid_cell`).
"""

from __future__ import annotations

import functools
import gc
from typing import Any, cast

import numpy as np
import torch

from lcab.cell import Cell
from lcab.cp.base import BLOCK_STAND_IN, STRATEGIES, HeadSplit, Plan, Strategy
from lcab.cp.schedule import COLLECTIVES, RankSchedule, RecordingContext
from lcab.cp.schedule_rules import ScheduleReport, check
from lcab.kernels import Kernel, PreparedAttention, Problem
from lcab.masks import make_mask
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray

GRID_WORLDS = (8, 16, 32, 64, 96)
"""1 to 12 nodes of 8 GPUs (the design card's largest job: 96)."""
GRID_MASKS = ("causal", "causal_document", "full", "sliding_window")
TOKENS_PER_RANK = 8
"""Tokens each rank holds in a check (before a balancer's padding): the schedule does not
depend on the length, its bytes scale with it."""


def check_schedule(
    strategy: Strategy, mask: AttnMask, problem: Problem, world: int
) -> ScheduleReport:
    """Record every rank of ``strategy`` on ``world`` ranks and check the records."""
    plan = strategy.plan(mask, problem, world)
    collecting = gc.isenabled()
    gc.disable()  # a 96-rank ring logs 90,000 events: the collector's passes over them cost 40 %
    try:
        return check(record(strategy, mask, problem, world, plan), plan)
    finally:
        if collecting:
            gc.enable()


def grid_case(
    name: str, mask_name: str, world: int, devices_per_node: int = 8
) -> tuple[Strategy, AttnMask, Problem]:
    """Strategy ``name`` (default options), its problem and one mask of the grid.

    Heads: twice the Ulysses degree U for queries and U / 2 for K/V (GQA whose K/V heads a
    Ulysses group replicates), so every strategy runs at every world; head dim 2, bf16.
    """
    strategy = STRATEGIES.get(name)({}, devices_per_node)
    u = strategy.ulysses_degree(world)
    seqlen = TOKENS_PER_RANK * world
    problem = Problem(seqlen, seqlen, 2 * u, max(u // 2, 1), 2, "bfloat16", "cpu")
    by_mask: dict[str, dict[str, Any]] = {
        "causal_document": {"doc_source": "uniform", "min_doc_len": seqlen // 8,
                            "max_doc_len": seqlen // 2},
        "sliding_window": {"window": seqlen // 8},
    }  # fmt: skip
    return strategy, make_mask(mask_name, seqlen, seed=0, **by_mask.get(mask_name, {})), problem


def grid_cell(name: str, mask_name: str, world: int, devices_per_node: int = 8) -> ScheduleReport:
    """The check of one cell of the grid (`grid_case`)."""
    strategy, mask, problem = grid_case(name, mask_name, world, devices_per_node)
    return check_schedule(strategy, mask, problem, world)


def check_job(cell: Cell) -> ScheduleReport | str:
    """The check of a configured context-parallel job at its world size (a str: not checked).

    On `TOKENS_PER_RANK` tokens per rank and head dim 1 (they change how much is sent, not
    what); a strategy that cannot run the job's heads gives "" (the refusal reports it).
    """
    strategy = STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)
    world, seqlen = cell.world_size, TOKENS_PER_RANK * cell.world_size
    problem = Problem(seqlen, seqlen, cell.heads_q, cell.heads_kv, 1, cell.dtype, "cpu")
    if strategy.reasons(problem, world):
        return ""
    try:
        mask = make_mask(cell.mask, seqlen, seed=cell.mask_seed, **cell.mask_params)
    except ValueError as err:
        return f"schedule not checked: mask {cell.mask} at {seqlen:,} tokens: {err}"
    return check_schedule(strategy, mask, problem, world)


def record(
    strategy: Strategy, mask: AttnMask, problem: Problem, world: int, plan: Plan | None = None
) -> list[RankSchedule]:
    """Every rank's schedule of one forward and backward of ``strategy`` on ``world`` ranks."""
    plan = plan or strategy.plan(mask, problem, world)
    logs = []
    BLOCK_STAND_IN[0] = _Blocks(mask)
    try:
        for rank in range(world):
            log = RankSchedule(rank)
            context = RecordingContext(rank, world, strategy.devices_per_node, "record", log=log)
            kernel = cast(Kernel, _StandInKernel(log))  # what a strategy's build asks of a kernel
            prepared = strategy.build(plan, mask, problem, kernel, context)
            q, k, v = _inputs(plan, problem, rank)
            log.start("fwd")
            out, _ = prepared.run(q, k, v)
            log.start("bwd")
            out.backward(torch.zeros_like(out))
            logs.append(log)
    finally:
        BLOCK_STAND_IN[0] = None
    return logs


def _inputs(plan: Plan, problem: Problem, rank: int) -> list[torch.Tensor]:
    """The q, k, v shards of ``rank`` (zeros: only their shapes matter)."""
    n, dtype = plan.shard_len, problem.torch_dtype
    heads = (problem.heads_q, problem.heads_kv, problem.heads_kv)
    return [torch.zeros((n, h, problem.head_dim), dtype=dtype, requires_grad=True) for h in heads]


class _Blocks:
    """Whether a block of the mask has work, read off the dense mask (the check's are small)."""

    def __init__(self, mask: AttnMask) -> None:
        self.dense = mask.to_dense().numpy().reshape(mask.num_heads, *mask.shape)
        self.masks: dict[tuple[int, int, bool], AttnMask] = {}

    def __call__(
        self, rows: IntArray, cols: IntArray, heads: HeadSplit | None, ulysses_index: int
    ) -> AttnMask:
        picked = self.dense
        if heads is not None and len(picked) > 1:
            picked = picked[heads.kv_heads_of(ulysses_index)]
        r, c = rows[rows >= 0], cols[cols >= 0]
        key = (len(rows), len(cols), bool(picked[:, r[:, None], c[None, :]].any()))
        if key not in self.masks:
            one = np.array([[0, 1, 0, 1, 0]] if key[2] else np.zeros((0, 5)), dtype=np.int64)
            self.masks[key] = AttnMask(one, key[0], key[1])
        return self.masks[key]


class _StandInKernel:
    """A kernel whose every call returns zeros and is recorded (the schedule is all it shows)."""

    name = "schedule"

    def __init__(self, log: RankSchedule) -> None:
        self.log = log

    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return _StandInCall(self.log)


class _StandInCall(PreparedAttention):
    """One block's call: zeros of the call's shapes (kept: no call writes what it returns)."""

    def __init__(self, log: RankSchedule) -> None:
        self.log = log

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.log.call()
        lse = _zeros((q.shape[1], q.shape[0]), torch.float32)
        if not (torch.is_grad_enabled() and q.requires_grad):
            return _zeros(q.shape, q.dtype), lse
        out = q * 0 + (k.sum() + v.sum()) * 0  # differentiated by autograd: a call then too
        out.register_hook(lambda grad: self.log.call())
        return out, lse

    def backward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.log.call()
        q, k, v = tensors[1:4]
        return _zeros(q.shape, q.dtype), _zeros(k.shape, k.dtype), _zeros(v.shape, v.dtype)


@functools.cache
def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


GUIDE_WORLD = (4, 2)
"""The guide's tables (`schedule_markdown`): 4 nodes x 2 ranks, so that USP and LoongTrain have
a Ulysses group of 2 and a ring of 4 (LoongTrain: 2 windows of 2)."""


def schedule_markdown() -> str:
    """Rank 0's recorded schedule of every strategy, one table each (the CP guide's section).

    One row per run of steps (kernel calls before it) that issue the same: each operation with
    the bytes rank 0 sends, whom to and from (a ring's neighbours) or over how many ranks (a
    collective), and whether a kernel call runs while it is in flight (``hidden``) or it
    blocks (``exposed``). Back-to-back collectives of one operation and size are one ``n ×``.
    """
    nodes, per_node = GUIDE_WORLD
    world, seqlen = nodes * per_node, 1024
    blocks = []
    for name in STRATEGIES.names():
        strategy = STRATEGIES.get(name)({}, per_node)
        problem = Problem(seqlen, seqlen, 8, 4, 64, "bfloat16", "cpu")
        events = record(strategy, make_mask("causal", seqlen), problem, world)[0].events
        steps: dict[tuple[str, int], list[list[Any]]] = {}
        for i, e in enumerate(events):
            if e.kind == "post":
                end = next(j for j, w in enumerate(events) if w.kind == "wait" and w.handle == i)
                hidden = any(w.kind == "call" for w in events[i:end])
                item = [1, e.op, e.sent, f"to {e.peer}, from {e.source}", hidden]
            elif e.kind in COLLECTIVES:
                item = [1, e.op, e.sent, f"{e.kind} over {len(e.group)}", False]
            else:
                continue
            issued = steps.setdefault((e.pass_, e.step), [])
            if issued and issued[-1][1:] == item[1:] and e.kind in COLLECTIVES:
                issued[-1][0] += 1
            else:
                issued.append(item)
        rows: list[list[Any]] = []  # [pass, first step, last step, text]
        for (pass_, step), issued in steps.items():
            text = "; ".join(
                f"{f'{n} × ' if n > 1 else ''}`{op}` {sent:,} B {peers}, "
                f"{'hidden' if hidden else 'exposed'}"
                for n, op, sent, peers, hidden in issued
            )
            if rows and rows[-1][0] == pass_ and rows[-1][3] == text and rows[-1][2] == step - 1:
                rows[-1][2] = step
            else:
                rows.append([pass_, step, step, text])
        table = ["| pass | steps | what rank 0 issues, in order |", "|---|---|---|"] + [
            f"| {p} | {a}{f'–{b}' if b > a else ''} | {text} |" for p, a, b, text in rows
        ]
        blocks.append(f"`{name}` ({strategy.summary}):\n\n" + "\n".join(table))
    return "\n\n".join(blocks)
