"""The one-GPU CP step: every strategy × CUDA kernel × mask, ranks sharing the GPU over gloo.

``python -m tests.gpu.cp_shared --out FILE`` (what `launchers/gpu_check.sh` runs) starts a world
of W gloo ranks on the visible GPU — W = 2, and 4 for USP and LoongTrain (a ring of more than
one rank; at 2 they would be Ulysses again), the world of 4 first — and runs each cell
forward and backward with the real CUDA kernel on every rank: Ulysses, Ring P2P, Ring
all-gather, USP and LoongTrain × every kernel that can take the strategy's blocks
(`Strategy.not_supported_reasons`, which includes `Strategy.block_reasons` and a missing
package) × ``causal``, ``causal_document`` and ``sliding_window``. Rank 0 judges each pass as
the kernel tier does (`tests.gpu.test_gpu_kernels`): per tensor, the error against an fp64
attention must be at most twice (backward: three times) a same-precision attention's, plus
1e-5; the measured bytes of every operation must equal the plan's. Each pass appends one
verification row with ``cp``, ``cp_options`` and ``world`` beside the kernel tier's fields —
the CP rows of the verification table (`lcab.report.gpu_verification`). Timings are not taken:
ranks share the GPU, so they would measure nothing.

``--list`` prints the cells and an estimate of the GPU time (no GPU needed: the dry run);
``--device cpu --kernels ranges`` runs the same machinery on CPU ranks, every transfer staged
through host copies (how the CPU test suite checks this script). ``--budget-s`` stops starting
cells once spent, so the step ends inside its share of the GPU check whatever compiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MASKS = ("causal", "causal_document", "sliding_window")
PARAMS: dict[str, dict[str, Any]] = {
    "causal_document": {"doc_source": "uniform", "min_doc_len": 37, "max_doc_len": 300},
    "sliding_window": {"window": 129},
}


def _configs() -> tuple[tuple[str, tuple[tuple[str, Any], ...], int], ...]:
    """(strategy, options, world) of every registered strategy; see `CONFIGS`."""
    from lcab.cp import STRATEGIES

    out = []
    for name in STRATEGIES.names():
        fields = {f.name for f in dataclasses.fields(STRATEGIES.get(name).options_cls)}
        if "window_count" in fields:
            out.append((name, (("ulysses_degree", 1),), 4))  # a double ring: 2 windows of 2
        elif "ulysses_degree" in fields:
            out.append((name, (("ulysses_degree", 2),), 4))  # 2 Ulysses groups x rings of 2
        else:
            out.append((name, (), 2))
    return tuple(out)


CONFIGS = _configs()
"""(strategy, options, world): one-dimensional strategies at world 2; those with a Ulysses
degree at world 4 only, with a ring of more than one rank — at world 2 their default Ulysses
degree (the ranks of the node) leaves a ring of one, which is Ulysses again and verifies
nothing of theirs; with windows, as a double ring over every rank."""
S, HQ, HKV, D = 1000, 8, 2, 64  # S not a multiple of 128, as in the kernel tier
SKIPPED_KERNELS = ("reference",)
"""The fp64 reference is the yardstick, not a kernel under test."""
COMPILED = ("flex", "sparse_flex")
"""Kernels that compile per mask and shape: run last, so a budget cut costs them first."""
SECONDS_PER_CELL = {"compiled": 8.0, "runs": 0.6, "refused": 0.05}
"""Expected GPU-machine seconds per cell on one H100 — fwd+bwd on every rank, the fp64 check,
the host staging; a compiled kernel's compiles (dynamic=False: one per block shape) spread over
its 3 masks; a refused cell is its reasons only. An estimate for the dry run, not a measurement."""
WORLD_START_S = 15.0
"""Starting a world of ranks on the GPU: processes, CUDA contexts, gloo rendezvous."""
ASSUMED_PACKAGES = ("flash_attn.cute",)
"""What the dry run assumes installed besides torch: FA4 (`launchers/gpu_check.sh`'s extras)."""


@dataclass(frozen=True)
class CPCell:
    """One strategy x kernel x mask at one world size."""

    strategy: str
    options: tuple[tuple[str, Any], ...]
    world: int
    kernel: str
    mask: str

    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        return f"{self.strategy}[{opts}]@{self.world} {self.kernel} {self.mask}"


def cuda_kernels() -> list[str]:
    """Registered kernels that run on CUDA (installed or not: a missing one gives its reason)."""
    from lcab.kernels import KERNELS, get_kernel

    names = [
        n
        for n in KERNELS.names()
        if "cuda" in get_kernel(n).caps.devices and n not in SKIPPED_KERNELS
    ]
    return sorted(names, key=lambda n: (n in COMPILED, n))


def cells(kernels: list[str]) -> list[CPCell]:
    """Every cell, grouped by world size (one world of ranks serves a group), the largest world
    first: a budget cut then falls on the world-2 cells, never on the only multi-rank rings of
    USP and LoongTrain (the H100 run cut four of those)."""
    out = [
        CPCell(strategy, options, world, kernel, mask)
        for strategy, options, world in CONFIGS
        for kernel in kernels
        for mask in MASKS
    ]
    return sorted(out, key=lambda c: (-c.world, c.kernel in COMPILED))


def classify(cell: CPCell, assumed: tuple[str, ...] = ASSUMED_PACKAGES) -> str:
    """What ``cell`` will do on a GPU machine with torch and the ``assumed`` packages.

    ``runs``, ``compiled`` (runs, with a compiling kernel) or ``refused`` (a structural reason:
    no LSE for a ring, a block the kernel cannot take, no backward; or a package not assumed),
    from the strategy's own reasons on this machine, less the ones a GPU machine would not give.
    """
    import torch

    from lcab.cell import torch_dtype
    from lcab.cp import STRATEGIES
    from lcab.kernels import Problem, get_kernel
    from lcab.masks import make_mask

    kernel = get_kernel(cell.kernel)
    strategy = STRATEGIES.get(cell.strategy)(dict(cell.options), cell.world)
    dtype = torch_dtype("bfloat16" if "bfloat16" in kernel.caps.dtypes else min(kernel.caps.dtypes))
    problem = Problem(S, S, HQ, HKV, D, dtype, torch.device("cuda"))
    mask = make_mask(cell.mask, S, seed=11, **PARAMS.get(cell.mask, {}))
    package = kernel.caps.package
    present = package is None or package in assumed
    reasons = [
        r
        for r in strategy.not_supported_reasons(kernel, problem, mask, cell.world, "fwd")
        if "no CUDA device is visible" not in r and not (present and "not installed" in r)
    ]
    if reasons:
        return "refused"
    return "compiled" if cell.kernel in COMPILED else "runs"


def shard(todo: list[CPCell], kinds: list[str], shards: int, index: int) -> list[CPCell]:
    """The cells of shard ``index`` of ``shards``: expected costs balanced greedily, same order.

    Shards run as separate processes at once (`launchers/gpu_check.sh`): the GPU idles under
    these small cells, so the host's cores — kernel launches, compiles — set the pace.
    """
    load = [0.0] * shards
    owner: dict[int, int] = {}
    by_cost = sorted(range(len(todo)), key=lambda i: -SECONDS_PER_CELL[kinds[i]])
    for i in by_cost:  # largest first, each to the least-loaded shard (ties: the lowest)
        target = min(range(shards), key=lambda s: (load[s], s))
        owner[i] = target
        load[target] += SECONDS_PER_CELL[kinds[i]]
    return [cell for i, cell in enumerate(todo) if owner[i] == index]


def estimate_s(kinds: list[str], worlds: int) -> float:
    """Expected GPU seconds of cells of ``kinds`` (`classify`) over ``worlds`` world sizes."""
    return sum(SECONDS_PER_CELL[k] for k in kinds) + WORLD_START_S * worlds


# ------------------------------------------------------------------------------ one rank
def _verdicts(cell: CPCell, ctx: Any, device: str, messages: Any) -> None:
    """Run ``cell`` on this rank; rank 0 puts one row per pass on ``messages``."""
    import torch

    from lcab.cell import torch_dtype
    from lcab.cp import STRATEGIES
    from lcab.cp.comm import STATS, is_backward_op
    from lcab.kernels import Problem, get_kernel
    from lcab.masks import make_mask
    from tests.gpu.test_gpu_kernels import _attention, _max_err

    kernel = get_kernel(cell.kernel)
    strategy = STRATEGIES.get(cell.strategy)(dict(cell.options), cell.world)
    dtype = torch_dtype("bfloat16" if "bfloat16" in kernel.caps.dtypes else min(kernel.caps.dtypes))
    mask = make_mask(cell.mask, S, seed=11, **PARAMS.get(cell.mask, {}))
    problem = Problem(S, S, HQ, HKV, D, dtype, torch.device(device))
    why = {
        p: strategy.not_supported_reasons(kernel, problem, mask, cell.world, p)
        for p in ("fwd", "bwd")
    }
    if why["fwd"]:
        why["bwd"] = why["bwd"] or why["fwd"]
    passes = [p for p in ("fwd", "bwd") if not why[p]]
    rows: dict[str, dict[str, Any]] = {
        p: {"verdict": "unsupported", "reason": "; ".join(why[p])} for p in ("fwd", "bwd") if why[p]
    }
    if passes:
        gen = torch.Generator(device=device).manual_seed(5)
        q, k, v, dout = (
            torch.randn(S, h, D, generator=gen, device=device, dtype=dtype)
            for h in (HQ, HKV, HKV, HQ)
        )
        plan = strategy.plan(mask, problem, cell.world)
        prepared = strategy.build(plan, mask, problem, kernel, ctx)
        leaves = [prepared.to_native(t).requires_grad_("bwd" in passes) for t in (q, k, v)]
        STATS.reset()
        out, _ = prepared.run(*leaves)
        if "bwd" in passes:
            out.backward(prepared.to_native(dout))
        got = {"out": prepared.from_native(out.detach())}
        if "bwd" in passes:
            got |= {
                n: prepared.from_native(t.grad)
                for n, t in zip(("dq", "dk", "dv"), leaves, strict=True)
            }
        measured = dict(STATS.bytes_sent)
        if ctx.rank == 0:
            dense = mask.to_dense().to(device)
            dense = dense if dense.dim() == 3 else dense.unsqueeze(0)
            dense = dense.repeat_interleave(HQ // dense.shape[0], dim=0)
            same, ref = {}, {}
            for precision, into in ((dtype, same), (torch.float64, ref)):
                ls = [t.detach().to(precision).requires_grad_(True) for t in (q, k, v)]
                o, _ = _attention(*ls, dense)
                into["out"] = o.detach()
                if "bwd" in passes:
                    grads = torch.autograd.grad(o, ls, dout.to(precision))
                    into.update(zip(("dq", "dk", "dv"), grads, strict=True))
            for pass_, names, factor in (("fwd", ("out",), 2.0), ("bwd", ("dq", "dk", "dv"), 3.0)):
                if pass_ not in passes:
                    continue
                errors = {n: _max_err(got[n], ref[n]) for n in names}
                bounds = {n: factor * _max_err(same[n], ref[n]) + 1e-5 for n in names}
                wanted = {
                    op: b
                    for op, b in plan.comm_bytes.items()
                    if is_backward_op(op) == (pass_ == "bwd")
                }
                sent = {op: measured.get(op, 0) for op in wanted}
                ok = all(errors[n] <= bounds[n] for n in names) and sent == wanted
                rows[pass_] = {
                    "verdict": "verified" if ok else "failed",
                    "errors": errors,
                    "bounds": bounds,
                    "comm_bytes": {op: [sent[op], wanted[op]] for op in wanted},
                }
    if ctx.rank == 0:
        for pass_ in ("fwd", "bwd"):
            messages.put(("row", _row(cell, pass_, ctx, device, rows[pass_])))


def _row(cell: CPCell, pass_: str, ctx: Any, device: str, fields: dict[str, Any]) -> dict[str, Any]:
    import torch

    from lcab.distributed import staging
    from lcab.kernels import get_kernel
    from tests.gpu.test_gpu_kernels import _version

    kernel = get_kernel(cell.kernel)
    cuda = device == "cuda"
    return {
        "kernel": cell.kernel,
        "mask": cell.mask,
        "pass": pass_,
        **fields,
        "cp": cell.strategy,
        "cp_options": dict(cell.options),
        "world": cell.world,
        "shared_device": bool(ctx.shared_device),
        "staging": staging.mode(),
        "gpu": torch.cuda.get_device_name(0) if cuda else f"none ({device})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "package": kernel.caps.package,
        "package_version": _version(kernel.caps.package, kernel.caps.requires),
        "python": platform.python_version(),
    }


def rank_main(
    rank: int,
    world: int,
    rendezvous: str,
    messages: Any,
    todo: list[CPCell],
    device: str,
    deadline: float,
) -> None:
    """Every rank runs every cell of ``todo`` (same world size) until rank 0's clock says stop."""
    import torch

    torch.set_num_threads(1)
    if device == "cpu":
        os.environ.setdefault("LCAB_CP_HOST_STAGING", "all")  # the staged path, on CPU
    from lcab.cp.comm import broadcast_floats
    from lcab.distributed.context import DistContext

    ctx = DistContext.start_local(rank, world, world, "gloo", rendezvous, 300, device)
    for index, cell in enumerate(todo):
        if broadcast_floats([float(time.time() > deadline)])[0]:  # rank 0's clock decides
            break
        if rank == 0:
            messages.put(("start", index))
        _verdicts(cell, ctx, device, messages)
    ctx.close()


# ------------------------------------------------------------------------------ the driver
def run(todo: list[CPCell], device: str, budget_s: float, out: Path | None) -> list[dict[str, Any]]:
    """Run ``todo``; a world that fails marks its current cell failed and restarts after it."""
    from lcab.distributed.launch import launch

    deadline = time.time() + budget_s
    rows: list[dict[str, Any]] = []

    def write(row: dict[str, Any]) -> None:
        rows.append(row)
        if out is not None:
            with out.open("a") as fh:
                fh.write(json.dumps(row, default=str) + "\n")

    for world in sorted({c.world for c in todo}, reverse=True):  # as `cells` orders them
        group = [c for c in todo if c.world == world]
        start = 0
        while start < len(group) and time.time() < deadline:
            chunk, current = group[start:], [start]

            def on_message(
                msg: tuple[Any, ...], base: int = start, cur: list[int] = current
            ) -> float:
                if msg[0] == "start":
                    cur[0] = base + int(msg[1])
                else:
                    write(msg[1])
                return 600.0  # one cell (a compile included) may take this long

            with tempfile.TemporaryDirectory() as folder:
                result = launch(
                    rank_main,
                    world,
                    (chunk, device, deadline),
                    600.0,
                    on_message,
                    folder,
                    preload=("torch", "lcab.cp", "lcab.kernels"),
                )
            if result.status == "done":
                break
            failed = group[current[0]]
            for pass_ in ("fwd", "bwd"):
                write(
                    {
                        "kernel": failed.kernel,
                        "mask": failed.mask,
                        "pass": pass_,
                        "verdict": "failed",
                        "error": f"{result.status}: {result.reason}"[:500],
                        "cp": failed.strategy,
                        "cp_options": dict(failed.options),
                        "world": world,
                    }
                )
            start = current[0] + 1
    return rows


def _of_shard(index: int, shards: int) -> str:
    return f" (shard {index} of {shards})" if shards > 1 else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.gpu.cp_shared", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--list", "--dry-run", action="store_true", help="print the cells and the estimate"
    )
    parser.add_argument("--out", type=Path, help="append verification rows to this JSONL file")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--kernels", help="comma-separated kernels (default: every CUDA kernel)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no cell after this")
    parser.add_argument("--shards", type=int, default=1, help="split the cells into N shards")
    parser.add_argument("--shard", type=int, default=0, help="run (or list) shard I, from 0")
    args = parser.parse_args(argv)
    if not 0 <= args.shard < args.shards:
        print(
            f"cp_shared: --shard {args.shard} with --shards {args.shards}; valid: "
            f"0 <= shard < shards",
            file=sys.stderr,
        )
        return 2
    kernels = args.kernels.split(",") if args.kernels else cuda_kernels()
    unknown = [k for k in kernels if k not in cuda_kernels()]
    if unknown:
        print(
            f"cp_shared: --kernels {','.join(unknown)} unknown; valid: {', '.join(cuda_kernels())}",
            file=sys.stderr,
        )
        return 2
    todo = cells(kernels)
    kinds = [classify(cell) for cell in todo]
    if args.shards > 1:
        mine = set(shard(todo, kinds, args.shards, args.shard))
        kinds = [k for c, k in zip(todo, kinds, strict=True) if c in mine]
        todo = [c for c in todo if c in mine]
    if args.list:
        for cell, kind in zip(todo, kinds, strict=True):
            print(f"{cell.label()}: {kind}")
        per_kind = {k: kinds.count(k) for k in SECONDS_PER_CELL}
        worlds = len({c.world for c in todo})
        print(
            f"{len(todo)} cells{_of_shard(args.shard, args.shards)} x fwd+bwd on {worlds} worlds: "
            f"{per_kind['runs']} run, "
            f"{per_kind['compiled']} run a compiled kernel, {per_kind['refused']} refused "
            f"(with torch and {', '.join(ASSUMED_PACKAGES)}); expected about "
            f"{estimate_s(kinds, worlds):.0f} s on one H100 (budget {args.budget_s:.0f} s)"
        )
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("cp_shared: no CUDA device visible to torch", file=sys.stderr)
        return 2
    began = time.time()
    rows = run(todo, args.device, args.budget_s, args.out)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    reached = len(
        {(r["cp"], json.dumps(r["cp_options"]), r["world"], r["kernel"], r["mask"]) for r in rows}
    )
    print(
        f"cp_shared: {reached}/{len(todo)} cells in {time.time() - began:.0f} s; "
        + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    )
    return 1 if counts.get("failed") or reached < len(todo) else 0


if __name__ == "__main__":
    sys.exit(main())
