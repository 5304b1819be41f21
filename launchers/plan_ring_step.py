"""Time one rank's published Ring P2P forward on one GPU, beside what the planner charges it.

The published Ring P2P forward is what the planner misses most ("Planning at scale" in the
README: on ``full_document`` at cp = 8 the published figure implies ~0.4 ms more per ring step
than predicted). The gap is in no single operation the probes time alone, so this command
replays, on one device and without communication, what one rank of the published
``FA3RingAttnFunc`` forward runs for one of the blog's packs (`lcab.plan.blog_packs`) on the
placement the planner replays: per ring step the unpad of q, k and v (gathers of the tokens of
every document the step's shards hold), one varlen kernel call listing every document, the pad
of its output and of its LSE; after the ring, the output merge. Device events in one stream
time each part while the host runs ahead (as in the real loop), so launch gaps are counted
where they fall. Each part is printed beside the planner's cost of the same rank
(`harness.LONGCA`; the kernel at its profile rate).

The kernel is torch's FlashAttention-2 varlen by default (nothing to install; ``--kernel fa3``
where FlashAttention-3 is installed), costed at the profile's ``fa2`` rate: its row checks the
planner's call model — tiles, documents, saturation — on real document shapes. The merge is a
stand-in for TransformerEngine's ``thd_out_correction`` (the same reads and writes, fused by
``torch.compile``), not its code — on a causal step's half it runs through an index, which TE
does not; the LSE pad, and the LSE merge inside the merge row, are timed but the planner does
not cost them. Full masks within documents (``full``, ``full_document``: a step's call is the
documents' blocks) and causal ones (``causal``, ``causal_document``: step 0 a causal call, a
step on an earlier rank's K/V calls with the first half of them, one on a later rank's with the
second half of the queries, each half extracted first, as ``thd_read_half_tensor`` does).

    python launchers/plan_ring_step.py --cp 8      # full_document, pack 0, rank 0

A lab tool, not part of the package; what it measured is in the planner guide
(lcab/plan/README.md, "What is left").
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lcab.cp.base import HeadSplit, accumulator_bytes, element_bytes
from lcab.kernels import Problem
from lcab.masks.core import AttnMask
from lcab.plan.calls import attends_only_past, causal_half, ring_calls_halves
from lcab.plan.hardware import Hardware, list_profiles, load_profile
from lcab.plan.harness import LONGCA, Elements
from lcab.plan.model import CostModel
from lcab.plan.predict import mask_for, strategy_for
from lcab.plan.published import paper_cell
from lcab.plan.replay import replay, zigzag_halves
from plan_copies import merge_lse, pad, pad_lse, unpad
from plan_empty_blocks import KERNELS, VarlenCall, kernel_reasons, varlen_call

MASKS = ("full_document", "full", "causal_document", "causal")
PARTS = ("extract half", "unpad q, k, v", "kernel", "pad out", "pad lse", "merge after the ring")
#: The planner's rate for each kernel the command can time (torch's varlen runs FA2's kernels).
PROFILE_KERNEL = {"torch_varlen": "fa2", "fa2": "fa2", "fa3": "fa3"}


@dataclass(frozen=True)
class StepCall:
    """One ring step's varlen call: which local rows it gathers and its sequence lists."""

    q_index: torch.Tensor
    """Local positions of the step's queries, document by document (the unpad indices)."""
    kv_index: torch.Tensor
    """Positions of its keys in the K/V block it received, document by document."""
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    q_half: torch.Tensor | None = None
    """Local positions of the half of the queries the step extracts first (None: all)."""
    kv_half: torch.Tensor | None = None
    """Positions of the half of the received K/V the step extracts first (None: all)."""
    causal: bool = False
    """A causal call (a causal mask's step on the rank's own K/V)."""


def step_calls(mask: AttnMask, layouts: Sequence[np.ndarray], rank: int) -> list[StepCall]:
    """The call of each ring step of ``rank`` (step t: the K/V block of rank ``rank - t``).

    A shard is an array of token ids (-1: padding). Every document is a sequence of every call,
    empty where a shard holds none of it (the published ``cu_seqlens`` list them all). On a
    mask that attends only the past (zigzag shards), a step on an earlier rank's K/V takes the
    first half of them and one on a later rank's the second half of the queries; the indices
    of such a step count from the start of its half.
    """
    lengths = mask.doc_lengths if mask.doc_lengths is not None else np.array([mask.seqlen_q])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    causal = attends_only_past(mask)
    shards = len(layouts)

    def halves(layout: np.ndarray) -> list[np.ndarray]:
        return zigzag_halves(np.arange(len(layout)), lengths, shards)

    def grouped(layout: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
        positions = np.flatnonzero(layout >= 0)
        docs = np.searchsorted(starts, layout[positions], side="right") - 1
        order = np.argsort(docs, kind="stable")
        counts = np.bincount(docs, minlength=len(lengths))
        cu = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)
        return torch.from_numpy(positions[order]), cu, int(counts.max())

    calls = []
    for t in range(shards):
        source = (rank - t) % shards
        q_pos, kv_pos = np.arange(len(layouts[rank])), np.arange(len(layouts[source]))
        q_half = kv_half = None
        half = causal_half(rank, source) if causal else ""
        if half == "q":
            q_pos = halves(layouts[rank])[1]
            q_half = torch.from_numpy(q_pos)
        elif half == "kv":
            kv_pos = halves(layouts[source])[0]
            kv_half = torch.from_numpy(kv_pos)
        q_index, cu_q, max_q = grouped(layouts[rank][q_pos])
        kv_index, cu_k, max_k = grouped(layouts[source][kv_pos])
        on_own = causal and source == rank
        calls.append(StepCall(q_index, kv_index, cu_q, cu_k, max_q, max_k, q_half, kv_half, on_own))
    return calls


def correction(
    out: torch.Tensor, step: torch.Tensor, lse: torch.Tensor, step_lse: torch.Tensor
) -> torch.Tensor:
    """``out + step · exp(step_lse − lse)``: ``thd_out_correction``'s arithmetic (LSE [h, t])."""
    scale = torch.exp(step_lse - lse).transpose(0, 1).unsqueeze(-1)
    return out + (step.float() * scale).to(out.dtype)


def time_forward(
    calls: list[StepCall],
    shape: tuple[int, int, int, int],
    call: VarlenCall,
    kv_heads_for_call: int,
    device: str,
    merge: Callable[..., torch.Tensor] = correction,
) -> dict[str, float]:
    """Milliseconds per part (`PARTS`) of one run of a rank's forward.

    ``shape``: (local tokens, query heads, K/V heads, head dim). For a kernel without GQA the
    gathered K/V are repeated to ``kv_heads_for_call`` heads, outside every timed part (the
    published code does not).
    """
    tokens, heads_q, heads_kv, dim = shape
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*size: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=dtype)

    q, k, v = rand(tokens, heads_q, dim), rand(tokens, heads_kv, dim), rand(tokens, heads_kv, dim)
    moved = [_on(c, device) for c in calls]
    rows = max(len(c.q_index) for c in calls)
    lse_stub = rand(heads_q, rows, dtype=torch.float32)  # its shape is what counts
    marks: list[tuple[str, object]] = []
    clock = _Clock(device)

    def mark(part: str) -> None:
        marks.append((part, clock.now()))

    mark("")
    outs, lses = [], []
    for c in moved:
        q_in, k_in, v_in = q, k, v
        if c.q_half is not None or c.kv_half is not None:
            if c.q_half is not None:
                q_in = q.index_select(0, c.q_half)
            if c.kv_half is not None:
                k_in, v_in = k.index_select(0, c.kv_half), v.index_select(0, c.kv_half)
            mark("extract half")
        qp, kp, vp = unpad(q_in, c.q_index), unpad(k_in, c.kv_index), unpad(v_in, c.kv_index)
        if kv_heads_for_call != heads_kv:
            mark("unpad q, k, v")
            repeat = kv_heads_for_call // heads_kv
            kp, vp = kp.repeat_interleave(repeat, 1), vp.repeat_interleave(repeat, 1)
            mark("")  # not the published code's: a kernel without GQA needs it
        else:
            mark("unpad q, k, v")
        result = call(qp, kp, vp, c.cu_q, c.cu_k, c.max_q, c.max_k, c.causal)
        out = result[0] if isinstance(result, tuple) else result
        mark("kernel")
        outs.append(pad(out, c.q_index, len(q_in)))
        mark("pad out")
        lses.append(pad_lse(lse_stub[:, : len(c.q_index)], c.q_index, len(q_in)))
        mark("pad lse")
    result_out = torch.zeros_like(q)
    lse = lses[0].clone()  # step 0 holds every query
    for c, step_lse in zip(moved[1:], lses[1:], strict=True):
        if c.q_half is None:
            merge_lse(lse, step_lse)
        else:  # the second half only (``thd_second_half_lse_correction``)
            lse[:, c.q_half] = merge_lse(lse[:, c.q_half], step_lse)
    for c, step_out, step_lse in zip(moved, outs, lses, strict=True):
        if c.q_half is None:
            result_out = merge(result_out, step_out, lse, step_lse)
        else:
            half = merge(result_out[c.q_half], step_out, lse[:, c.q_half], step_lse)
            result_out[c.q_half] = half
    mark("merge after the ring")
    clock.wait()
    spent = dict.fromkeys(PARTS, 0.0)
    for (_, began), (part, ended) in itertools.pairwise(marks):
        if part:
            spent[part] += clock.ms(began, ended)
    return spent


def warm_up(
    calls: list[StepCall],
    shape: tuple[int, int, int, int],
    call: VarlenCall,
    kv_heads_for_call: int,
    device: str,
    merge: Callable[..., torch.Tensor],
) -> Callable[..., torch.Tensor]:
    """Run the forward once, compiling ``merge``; return the merge to time.

    That is ``merge``, or the eager `correction` where compiling it fails (said on stdout).
    """
    try:
        time_forward(calls, shape, call, kv_heads_for_call, device, merge)
        return merge
    except Exception as exc:  # any compiler failure: time the eager merge instead
        if merge is correction:
            raise
        print(f"torch.compile failed ({type(exc).__name__}: {exc}); the merge runs eagerly")
        time_forward(calls, shape, call, kv_heads_for_call, device, correction)
        return correction


def planner_parts(
    mask: AttnMask, cell_args: tuple[str, int, int], rank: int, hardware: Hardware, kernel: str
) -> tuple[dict[str, float], list[np.ndarray]]:
    """The planner's ms per part for ``rank`` of the published cell, and the shards it places."""
    mask_name, world, sample = cell_args
    cell = paper_cell(mask_name, "ring", world, sample)
    problem = cell.problem()
    strategy = strategy_for(cell)
    plan = strategy.plan(mask, problem, world)
    replayed = replay(strategy, mask, problem, world, plan, LONGCA)
    model = CostModel(hardware, kernel, min(cell.devices_per_node, world))
    bandwidth = hardware.memory_gbps * 1e9
    parts = dict.fromkeys(PARTS, 0.0)
    windows = replayed.passes["fwd"][rank]
    halves = ring_calls_halves(LONGCA, plan.placement.balancer, mask)
    for t, stage in enumerate(windows[0].stages):
        source = (rank - t) % world
        half = causal_half(rank, source) if halves else ""
        extracted = _half_bytes(half, plan.shard_len, plan.heads, problem) / bandwidth
        for work in stage.calls:
            plain = work.memory_bytes - work.gather_bytes - work.scatter_bytes
            unpadded = work.gather_bytes / (bandwidth * hardware.gather_efficiency)
            scattered = work.scatter_bytes / (bandwidth * hardware.scatter_efficiency)
            padded = plain / bandwidth - extracted + scattered
            parts["extract half"] += 1e3 * extracted
            parts["unpad q, k, v"] += 1e3 * unpadded
            parts["pad out"] += 1e3 * padded
            copies = extracted + unpadded + padded
            parts["kernel"] += 1e3 * float(model.compute_s(work, False) - copies)
    for window in windows[1:]:  # the merge after the ring
        parts["merge after the ring"] += 1e3 * float(
            sum(model.compute_s(w, False) for s in window.stages for w in s.calls)
        )
    return parts, list(plan.rank_layouts)


def _half_bytes(half: str, tokens: int, heads: HeadSplit, problem: Problem) -> float:
    """Bytes the published code moves extracting a causal step's ``half`` (q | kv | "")."""
    if not half:
        return 0.0
    q_size, kv_size = heads.local_q * problem.head_dim, heads.local_kv * problem.head_dim
    q_tokens = tokens // 2 if half == "q" else tokens
    kv_tokens = tokens // 2 if half == "kv" else tokens
    elements = Elements(q_tokens * q_size, kv_tokens * kv_size, 0.0, 0.0)
    moved = LONGCA.half_passes(half, False).bytes(
        elements, element_bytes(problem), accumulator_bytes(problem)
    )
    return moved.total


class _Clock:
    """Device events on CUDA (no host sync until `wait`), the host clock elsewhere."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def now(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wait(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, began: object, ended: object) -> float:
        if self.cuda:
            assert isinstance(began, torch.cuda.Event) and isinstance(ended, torch.cuda.Event)
            return float(began.elapsed_time(ended))
        assert isinstance(began, float) and isinstance(ended, float)
        return 1e3 * (ended - began)


def _on(call: StepCall, device: str) -> StepCall:
    """``call`` with its index and sequence tensors on ``device``."""
    return dataclasses.replace(
        call,
        q_index=call.q_index.to(device),
        kv_index=call.kv_index.to(device),
        cu_q=call.cu_q.to(device),
        cu_k=call.cu_k.to(device),
    )


def main(argv: list[str]) -> int:
    """Print measured and planned ms per part (exit 2 on bad input or without a GPU)."""
    parser = argparse.ArgumentParser(prog="python launchers/plan_ring_step.py", description=__doc__)
    parser.add_argument("--cp", type=int, default=8, help="ring size (the blog's cp)")
    parser.add_argument("--mask", default="full_document", choices=MASKS)
    parser.add_argument("--sample", type=int, default=0, help="blog pack (document masks)")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--kernel", default="torch_varlen", choices=KERNELS)
    parser.add_argument("--hardware", default="h100_nvlink_ib")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eager-merge", action="store_true", help="no torch.compile")
    args = parser.parse_args(argv)
    bad = []
    if args.cp < 2 or args.cp % 8:
        bad.append(f"--cp={args.cp} must be a multiple of 8 (the blog's cp: 8, 16, 32, 64)")
    if not 0 <= args.rank < max(args.cp, 1):
        bad.append(f"--rank={args.rank} must be in 0..{args.cp - 1}")
    if not 0 <= args.sample < 20:
        bad.append(f"--sample={args.sample} must be in 0..19 (the blog's 20 packs)")
    if args.repeats < 1:
        bad.append(f"--repeats={args.repeats} must be >= 1")
    if args.hardware not in list_profiles() and not Path(args.hardware).is_file():
        bad.append(
            f"--hardware={args.hardware!r} is no profile; valid: {', '.join(list_profiles())}"
        )
    if not torch.cuda.is_available():
        bad.append("torch sees no CUDA device (this command times GPU kernels)")
    else:
        bad += kernel_reasons(args.kernel)
    if bad:
        print(f"plan_ring_step: {'; '.join(bad)}", file=sys.stderr)
        return 2
    return _report(args)


def _report(args: argparse.Namespace) -> int:
    """Measure and print (CUDA available, arguments checked)."""
    cell = paper_cell(args.mask, "ring", args.cp, args.sample)
    mask = mask_for(cell)
    hardware = load_profile(args.hardware)
    kernel = PROFILE_KERNEL[args.kernel]
    planned, layouts = planner_parts(
        mask, (args.mask, args.cp, args.sample), args.rank, hardware, kernel
    )
    calls = step_calls(mask, layouts, args.rank)
    call, gqa = varlen_call(args.kernel)
    merge = correction if args.eager_merge else torch.compile(correction)
    shape = (len(layouts[args.rank]), cell.heads_q, cell.heads_kv, cell.head_dim)
    kv_heads = cell.heads_kv if gqa else cell.heads_q
    merge = warm_up(calls, shape, call, kv_heads, "cuda", merge)
    runs = [time_forward(calls, shape, call, kv_heads, "cuda", merge) for _ in range(args.repeats)]
    measured = {part: float(np.median([r[part] for r in runs])) for part in PARTS}
    name = torch.cuda.get_device_name(0)
    print(
        f"{name}, torch {torch.__version__}, {args.kernel} (planner: {kernel} on {hardware.name})"
    )
    print(
        f"{args.mask}, cp={args.cp}, rank {args.rank}, blog pack {args.sample}: "
        f"{shape[0]} local tokens, {len(calls[0].cu_q) - 1} documents, {len(calls)} steps"
    )
    print(f"{'part':<22} {'measured ms':>12} {'planner ms':>11}")
    for part in PARTS:
        note = "  (not costed)" if part == "pad lse" else ""
        print(f"{part:<22} {measured[part]:>12.3f} {planned[part]:>11.3f}{note}")
    print(f"{'total':<22} {sum(measured.values()):>12.3f} {sum(planned.values()):>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
