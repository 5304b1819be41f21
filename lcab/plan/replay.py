"""Replay a strategy's real plan, rank by rank and step by step, as work and transfers.

The planner does not average: it takes the plan the runner would execute (`Strategy.plan`: the
same balancer, shards, head split and analytic bytes) and rebuilds, for every rank and pass, the
sequence the strategy's code performs — the Ulysses all-to-alls around one local call, every
ring step's pair of shards, LoongTrain's windows with their prefetched outer transfer, the
all-gather and reduce-scatter — with what each step overlaps. Step work comes from
`lcab.plan.areas` (exact attended area of the step's shard pair), bytes from the plan's own
per-operation volumes, so the replay moves exactly what the runner counts (tests check both).

How the code overlaps, and so how the replay does (`lcab.cp.ring_attention`; the schedule check's
recording holds the two equal transfer by transfer, `tests/unit/test_cp_schedule_grid.py`):

* a ring step posts the next K/V transfer before its compute and waits after it (overlapped);
* in the backward, a step's dK/dV accumulator, sent after its compute, travels during the next
  step's compute; the hop that brings a window's own block's accumulator home is waited at once
  (exposed);
* LoongTrain's next-window K/V travels during a whole window of inner steps; the window's dK/dV
  accumulator moves on to the next window during its first step (the last one exposed);
* all-to-alls, the all-gather and the reduce-scatter are blocking collectives (exposed).

That is lcab's runner; another implementation of the same schedules (`lcab.plan.harness`)
changes the copies around each call, whether a ring exchange is batched, and when the dK/dV
accumulator travels.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from lcab.cp.base import Plan, Strategy, accumulator_bytes, element_bytes
from lcab.cp.ulysses import a2a_bytes
from lcab.distributed.groups import Grid
from lcab.flops import PASS_FACTORS
from lcab.kernels import Problem
from lcab.masks.core import AttnMask
from lcab.plan.areas import pair_work
from lcab.plan.calls import (
    Call,
    CallWorks,
    causal_half,
    copies_work,
    documents_of,
    merge_work,
    ring_calls_halves,
)
from lcab.plan.harness import LCAB, Elements, Harness
from lcab.plan.steps import Links, Stage, Transfer, Window, Work


@dataclass
class Replay:
    """Every rank's windows per pass ("fwd", "bwd"); ranks share the structure (lockstep)."""

    plan: Plan
    problem: Problem
    devices_per_node: int
    harness: Harness = LCAB
    passes: dict[str, list[tuple[Window, ...]]] = field(default_factory=dict)
    global_flops: dict[str, float] = field(default_factory=dict)

    def transfers(self, rank: int, pass_: str) -> list[Transfer]:
        """Every transfer of ``rank`` in ``pass_``."""
        out: list[Transfer] = []
        for window in self.passes[pass_][rank]:
            out += window.background
            for stage in window.stages:
                out += stage.during + stage.after
        return out

    def bytes_by_op(self, rank: int) -> dict[str, int]:
        """Bytes ``rank`` sends per operation over forward + backward (the plan's accounting)."""
        total: Counter[str] = Counter()
        for pass_ in self.passes:
            for t in self.transfers(rank, pass_):
                total[t.op] += t.nbytes
        return dict(total)

    def work(self, rank: int, pass_: str) -> list[Work]:
        """The attention kernel calls of ``rank`` in ``pass_``, in order.

        Not the matrix products a harness adds (`Work.matmul_flops`).
        """
        windows = self.passes[pass_][rank]
        return [work for w in windows for s in w.stages for work in s.calls if work.flops]


def replay(
    strategy: Strategy,
    mask: AttnMask,
    problem: Problem,
    world: int,
    plan: Plan | None = None,
    harness: Harness = LCAB,
    diagonal: bool = True,
) -> Replay:
    """The replay of ``strategy`` running ``mask`` on ``world`` ranks (fwd and bwd).

    ``harness``: whose implementation of the schedule (default: lcab's runner).
    ``diagonal=False`` leaves the calls' band-edge rows uncounted (`Work.diagonal_rows` 0):
    only a kernel that masks whole pieces afterwards (``KernelRate.diagonal_rows``, lcab's
    `ranges`) is costed by them, and counting them was 40 % of a GPU planner sweep's time.
    """
    plan = plan or strategy.plan(mask, problem, world)
    dpn = strategy.devices_per_node
    out = Replay(plan, problem, dpn, harness)
    forward = 4 * mask.area() * (problem.heads_q // mask.num_heads) * problem.head_dim
    for pass_ in ("fwd", "bwd"):
        num, den = PASS_FACTORS[pass_]
        out.global_flops[pass_] = forward * num / den
    builder = _BUILDERS[_family(strategy.name)]
    fwd, bwd = builder(plan, mask, problem, Links(dpn, harness.p2p_batched), harness, diagonal)
    tail = _projection_gradients(plan, problem, harness)
    out.passes = {"fwd": fwd, "bwd": [(*windows, *tail) for windows in bwd]}
    return out


def _projection_gradients(plan: Plan, problem: Problem, harness: Harness) -> tuple[Window, ...]:
    """The backward's last window when the timed region includes the Q/K/V projections."""
    flops, traffic = harness.projection_costs(
        plan.shard_len, problem.heads_q, problem.heads_kv, problem.head_dim, element_bytes(problem)
    )
    if not flops:
        return ()
    return (Window((Stage(Work(0.0, 0.0, memory_bytes=traffic, matmul_flops=flops)),)),)


def _family(name: str) -> str:
    families = {"ulysses": "ulysses", "ring": "ring", "usp": "ring", "loongtrain": "ring"}
    families["ring_allgather"] = "allgather"
    if name not in families:
        raise ValueError(f"the planner has no replay for strategy {name!r}; valid: {families}")
    return families[name]


def _ulysses_ends(
    plan: Plan, problem: Problem, links: Links, rank: int, bwd: bool, harness: Harness
) -> tuple[Stage, Stage]:
    """The exposed all-to-alls before and after the local work of a Ulysses group.

    The harness's layout copies around them (its ``ulysses_layout`` passes, over the tensors
    the group's member holds between the all-to-alls) run before the first.
    """
    grid = Grid(plan.world, plan.ulysses, rank)
    group = grid.my_ulysses_group()
    q, kv = a2a_bytes(plan, problem)
    op = "a2a_grad" if bwd else "a2a"
    before = [q] if bwd else [q, kv, kv]  # fwd: q, k, v in; bwd: dout in
    after = [q, kv, kv] if bwd else [q]  # fwd: out back; bwd: dq, dk, dv back
    layout = harness.layout_passes(bwd)
    copies = None
    if layout is not None:
        tokens = plan.shard_len * plan.ulysses
        heads = plan.heads
        elements = Elements(
            tokens * heads.local_q * problem.head_dim,
            tokens * heads.local_kv * problem.head_dim,
            0.0,
            0.0,
        )
        copies = copies_work(layout, elements, problem)

    def stage(sizes: list[int], work: Work | None = None) -> Stage:
        return Stage(work, after=tuple(links.collective(op, "a2a", b, rank, group) for b in sizes))

    return stage(before, copies), stage(after)


def _ulysses(
    plan: Plan, mask: AttnMask, problem: Problem, links: Links, harness: Harness, diagonal: bool
) -> tuple[list, list]:
    order = np.concatenate(plan.rank_layouts)  # every token (a group holds the whole sequence)
    call_work = CallWorks(pair_work(mask, [order], [order], diagonal=diagonal), plan, problem)
    call = Call("ulysses", harness, len(order), len(order), documents_of(mask))
    passes: tuple[list, list] = ([], [])
    for bwd, ranks in enumerate(passes):
        for rank in range(plan.world):
            work = call_work(rank % plan.ulysses, 0, 0, bool(bwd), call)
            before, after = _ulysses_ends(plan, problem, links, rank, bool(bwd), harness)
            ranks.append((Window((before, Stage(work), after)),))
    return passes


def _allgather(
    plan: Plan, mask: AttnMask, problem: Problem, links: Links, harness: Harness, diagonal: bool
) -> tuple[list, list]:
    """Ring All-Gather: gather K/V, one call per rank (or one per zigzag half), reduce-scatter.

    Copies the harness makes once per pass (reorders of the gathered tensors) run first in
    the calls' stage: a rank's copies and calls add up before it waits for the collective.
    """
    everything = np.concatenate(plan.placement.layouts)
    halves = harness.allgather_halves and plan.placement.balancer == "zigzag"
    row_sets = list(plan.rank_layouts)
    if halves:
        docs = np.asarray(mask.doc_lengths if mask.doc_lengths is not None else [mask.seqlen_q])
        row_sets = [h for rows in row_sets for h in zigzag_halves(rows, docs, len(row_sets))]
    calls = len(row_sets) // plan.world
    call_work = CallWorks(pair_work(mask, row_sets, [everything], diagonal=diagonal), plan, problem)
    call = Call("allgather", harness, plan.shard_len // calls, len(everything), documents_of(mask))
    moved = plan.comm_bytes.get("allgather_kv", 0)  # each way: K and V, all but one shard
    group = list(range(plan.world))
    whole = Elements(
        plan.shard_len * plan.heads.local_q * problem.head_dim,
        len(everything) * plan.heads.local_kv * problem.head_dim,
        0.0,
        0.0,
    )
    fwd, bwd = [], []
    for rank in range(plan.world):
        gather = links.collective("allgather_kv", "allgather", moved, rank, group)
        scatter = links.collective("allgather_kv_grad", "reduce_scatter", moved, rank, group)
        comm_f = (Stage(None, after=(gather,)),) if moved else ()
        comm_b = (Stage(None, after=(scatter,)),) if moved else ()
        regather = comm_f if harness.regather_bwd else ()
        stages = []
        for bwd_ in (False, True):
            once = harness.once_passes("allgather", bwd_)
            rows = range(rank * calls, (rank + 1) * calls)
            works_ = [call_work(0, row, 0, bwd_, call) for row in rows]
            if once is not None:
                works_.insert(0, copies_work(once, whole, problem))
            stages.append(Stage(works_[0], then=tuple(works_[1:])))
        fwd.append((Window((*comm_f, stages[0])),))
        bwd.append((Window((*regather, stages[1], *comm_b)),))
    return fwd, bwd


def zigzag_halves(layout: np.ndarray, doc_lengths: np.ndarray, shards: int) -> list[np.ndarray]:
    """A zigzag shard's two halves: chunk ``p`` of every document, then chunk ``2P - 1 - p``.

    The zigzag balancer (`lcab.cp.balance.zigzag`) pads every document to a multiple of
    ``2 * shards`` and lays out, per document, its two chunks one after the other; the
    published code's ``thd_read_half_tensor`` takes the same halves.
    """
    first, second, at = [], [], 0
    for length in doc_lengths.tolist():
        chunk = -(-int(length) // (2 * shards))
        first.append(layout[at : at + chunk])
        second.append(layout[at + chunk : at + 2 * chunk])
        at += 2 * chunk
    return [np.concatenate(first), np.concatenate(second)]


def _ring(
    plan: Plan, mask: AttnMask, problem: Problem, links: Links, harness: Harness, diagonal: bool
) -> tuple[list, list]:
    """Ring P2P, USP and LoongTrain: (Ulysses ends around) a windowed ring of R positions."""
    shards = list(plan.placement.layouts)
    call_work = CallWorks(pair_work(mask, shards, shards, diagonal=diagonal), plan, problem)
    r, w = plan.ring, plan.windows
    s = r // w
    prefix = {"ring": "ring", "usp": "usp_ring", "loongtrain": "loong"}[plan.strategy]
    inner, outer = (f"{prefix}_inner", f"{prefix}_outer") if w > 1 else (prefix, prefix)
    if plan.strategy == "loongtrain" and w == 1:
        inner = outer = "loong_inner"
    block = plan.ring_block(problem.head_dim)
    kv = block * element_bytes(problem)
    acc_elem = accumulator_bytes(problem) if harness.dkv_in_accumulator else element_bytes(problem)
    acc = block * acc_elem
    tokens = plan.shard_len * plan.ulysses
    whole = Call("ring", harness, tokens, tokens, documents_of(mask))
    halves = ring_calls_halves(harness, plan.placement.balancer, mask)
    calls = {
        "": whole,
        "q": replace(whole, q_tokens=tokens // 2, half="q"),
        "kv": replace(whole, kv_tokens=tokens // 2, half="kv"),
    }

    def call_for(p: int, source: int) -> Call:
        """The call of ring position ``p`` on the K/V of position ``source``."""
        return calls[causal_half(p, source)] if halves else whole

    passes: tuple[list, list] = ([], [])
    for bwd, ranks in enumerate(passes):
        per_call = {id(c): call_work.per_call(c, bool(bwd)) for c in calls.values()}
        for rank in range(plan.world):
            grid = Grid(plan.world, plan.ulysses, rank)
            ring = grid.my_ring()
            p, ui = grid.ring_index, grid.ulysses_index
            window, slot = divmod(p, s)

            def at(win: int, sl: int, ring: list[int] = ring) -> int:
                return ring[(win % w) * s + sl % s]

            nxt_inner, nxt_outer = at(window, slot + 1), at(window + 1, slot)
            windows = []
            carried: tuple[Transfer, ...] = ()  # an accumulator travelling into the next window
            merged: list[Call] = []  # the steps whose partial results are merged after the ring
            # the same for every step of the rank: its next K/V block and dK/dV accumulator
            next_kv = (links.p2p(f"{inner}_kv{'_bwd' if bwd else ''}", kv, rank, nxt_inner, s),)
            dkv = (links.p2p(f"{inner}_dkv", acc, rank, nxt_inner, s),)

            for o in range(w):
                stages = []
                # steps differ only as first, middle and last of the window
                parts = (bool(bwd), harness, next_kv, dkv, links)
                first = _step_transfers(0, s, carried, *parts)
                last = _step_transfers(s - 1, s, (), *parts)
                middle = _step_transfers(1, s, (), *parts) if s > 2 else last
                carried = ()
                for t in range(s):
                    source = ((window - o) % w) * s + (slot - t) % s
                    call = call_for(p, source)
                    merged.append(call)
                    work, finish = call_work.step(per_call[id(call)], ui, p, source)
                    during, after = first if t == 0 else last if t == s - 1 else middle
                    stages.append(links.stage(work, during, after, finish))
                hop = harness.dkv_overlapped and (
                    harness.dkv_home_hop
                    or (harness.window_dkv_hop and plan.strategy == "loongtrain")
                )
                if bwd and s > 1 and hop:  # one more inner hop, waited at once
                    stages.append(links.stage(None, (), links.transfers(dkv), ()))
                if bwd and w > 1:  # the window's accumulator moves on to the next window
                    outer_dkv = (links.p2p(f"{outer}_dkv", acc, rank, nxt_outer, w),)
                    if harness.dkv_overlapped and o < w - 1:
                        carried = outer_dkv
                    else:
                        stages.append(links.stage(None, (), links.transfers(outer_dkv), ()))
                background = (
                    (links.p2p(f"{outer}_kv{'_bwd' if bwd else ''}", kv, rank, nxt_outer, w),)
                    if o < w - 1
                    else ()
                )
                windows.append(Window(tuple(stages), background))
            merge = merge_work(merged, plan, problem, harness, bool(bwd))
            windows += [Window((Stage(merge),))] if merge is not None else []
            if plan.ulysses > 1:
                before, after_a2a = _ulysses_ends(plan, problem, links, rank, bool(bwd), harness)
                windows = [Window((before,)), *windows, Window((after_a2a,))]
            ranks.append(tuple(windows))
    return passes


def _step_transfers(
    t: int,
    s: int,
    carried: tuple[Transfer, ...],
    bwd: bool,
    harness: Harness,
    next_kv: tuple[Transfer, ...],
    dkv: tuple[Transfer, ...],
    links: Links,
) -> tuple[tuple[Transfer, ...], tuple[Transfer, ...]]:
    """(during, after) of step ``t`` of a window of ``s`` steps (``carried``: into step 0)."""
    during: tuple[Transfer, ...] = next_kv if t < s - 1 else ()
    after: tuple[Transfer, ...] = ()
    if bwd and s > 1 and harness.dkv_overlapped:
        # the previous step's accumulator travels during this step's compute
        during += dkv if t > 0 else ()
    elif bwd and s > 1:
        after = dkv
    if t == 0:
        during += carried
    return links.transfers(during), links.transfers(after)


_BUILDERS = {"ulysses": _ulysses, "allgather": _allgather, "ring": _ring}
