"""Run a grid of CP cases on one world of gloo ranks, each case checked against fp64.

One process group serves every case of a world size (spawning costs seconds on 2 cores); each
case has its own deadline, and after a failure the world is restarted for the remaining cases,
so one bad case cannot hide the others or hang the suite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lcab.distributed.launch import launch

TOL = 1e-10  # fp64: errors are normalised by the reference's largest magnitude


@dataclass(frozen=True)
class Case:
    strategy: str
    options: tuple[tuple[str, Any], ...]
    mask: str
    mask_params: tuple[tuple[str, Any], ...]
    seqlen: int
    heads_q: int
    heads_kv: int
    kernel: str = "ranges"
    head_dim: int = 4
    backward_calls: int = 1  # >1: backward repeated on one forward (as the benchmark times it)

    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        heads = f"H={self.heads_q}:{self.heads_kv}"
        return f"{self.strategy}[{opts}] {self.mask} S={self.seqlen} {heads} {self.kernel}"


@dataclass
class Outcome:
    case: Case
    status: str  # ok | skipped | failed
    detail: str = ""
    errors: dict[str, float] = field(default_factory=dict)


def _normalised(x: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(x).any():
        return math.inf
    return float((x - ref).abs().max()) / max(float(ref.abs().max()), 1e-300)


def rank_main(rank: int, world: int, rendezvous: str, messages: Any, cases: list[Case]) -> None:
    """Every rank runs every case; rank 0 compares with the reference and reports."""
    torch.set_num_threads(1)
    from lcab.cp import STRATEGIES
    from lcab.cp.comm import STATS, gather_floats
    from lcab.distributed.context import DistContext
    from lcab.kernels import Problem, get_kernel
    from lcab.masks import make_mask

    ctx = DistContext.start_local(rank, world, 2, "gloo", rendezvous, 120)
    for index, case in enumerate(cases):
        mask = make_mask(case.mask, case.seqlen, seed=index, **dict(case.mask_params))
        gen = torch.Generator().manual_seed(index)
        shapes = {"q": case.heads_q, "k": case.heads_kv, "v": case.heads_kv, "dout": case.heads_q}
        x = {
            n: torch.randn(case.seqlen, h, case.head_dim, generator=gen, dtype=torch.float64)
            for n, h in shapes.items()
        }
        problem = Problem(
            case.seqlen, case.seqlen, case.heads_q, case.heads_kv, case.head_dim, torch.float64
        )
        strategy = STRATEGIES.get(case.strategy)(dict(case.options), 2)
        kernel = get_kernel(case.kernel)
        reasons = strategy.reasons(problem, world) + strategy.kernel_reasons(kernel, problem, "bwd")
        if reasons:
            if rank == 0:
                messages.put(("result", index, "skipped", "; ".join(reasons), {}))
            continue
        plan = strategy.plan(mask, problem, world)
        prepared = strategy.build(plan, mask, problem, kernel, ctx)
        leaves = [prepared.to_native(x[n]).requires_grad_(True) for n in ("q", "k", "v")]
        STATS.reset()
        out, _ = prepared.run(*leaves)
        dout = prepared.to_native(x["dout"])
        out.backward(dout, retain_graph=case.backward_calls > 1)
        comm_ok = dict(STATS.bytes_sent) == plan.comm_bytes
        for call in range(1, case.backward_calls):
            for leaf in leaves:
                leaf.grad = None
            out.backward(dout, retain_graph=call < case.backward_calls - 1)
        all_comm_ok = min(gather_floats(float(comm_ok)))
        got = [prepared.from_native(t) for t in (out.detach(), *(leaf.grad for leaf in leaves))]
        if rank == 0:
            ref = [x[n].clone().requires_grad_(True) for n in ("q", "k", "v")]
            ref_out, _ = get_kernel("reference")(ref[0], ref[1], ref[2], mask)
            ref_out.backward(x["dout"])
            expected = [ref_out.detach(), *(r.grad for r in ref)]
            errors = {
                n: _normalised(g, e)
                for n, g, e in zip(("out", "dq", "dk", "dv"), got, expected, strict=True)
            }
            detail = (
                ""
                if all_comm_ok
                else (f"comm bytes {dict(STATS.bytes_sent)} != analytic {plan.comm_bytes}")
            )
            status = "ok" if all_comm_ok and max(errors.values()) <= TOL else "failed"
            messages.put(("result", index, status, detail, errors))
    ctx.close()


def run_grid(
    world: int,
    cases: list[Case],
    workdir: Path,
    case_timeout: float = 60.0,
    rank_fn: Callable[..., None] | None = None,
) -> list[Outcome]:
    """Every case's outcome; a hang or crash fails its case and the rest run on a new world.

    ``rank_fn`` replaces `rank_main` (same arguments), e.g. to install library stand-ins in
    each rank's process before it runs the cases.
    """
    outcomes: dict[int, Outcome] = {}
    start = 0
    while start < len(cases):
        chunk = cases[start:]

        def on_message(msg: tuple[Any, ...], chunk: list[Case] = chunk, base: int = start) -> float:
            _, index, status, detail, errors = msg
            outcomes[base + index] = Outcome(chunk[index], status, detail, errors)
            return case_timeout

        result = launch(rank_fn or rank_main, world, (chunk,), case_timeout, on_message, workdir)
        done = max(outcomes, default=start - 1) + 1
        if result.status != "done":
            outcomes[done] = Outcome(
                cases[done], "failed", f"{result.status}: {result.reason}\n{result.detail}"
            )
            done += 1
        start = max(done, start + 1) if result.status != "done" else len(cases)
    return [outcomes[i] for i in range(len(cases)) if i in outcomes]
