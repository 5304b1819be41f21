"""Time a published ring step's copies on this device, against what the planner costs them.

The planner costs what the published baselines do around each FA3 call (`harness.LONGCA`) as
memory passes; reads through an index (unpad) at ``gather_efficiency`` of the profile's
bandwidth and writes through one (pad) at ``scatter_efficiency``, which this command measured
(lcab/plan/README.md: on an H100 the gathers reached 0.60 of its datasheet rate, the scatters
0.39; an H200 had given 0.57 and 0.27 of its own, at the same absolute scatter rate).
It needs neither FlashAttention nor a second rank: it runs the PyTorch operations the baselines
run around a ring step's forward call — ``fa_varlen_thd_unpad`` (a gather with an expanded
index), ``fa_varlen_thd_pad`` (zeros, then a scatter), the LSE pad and the LSE merge (eagerly;
the baselines script it, which fuses it) — on tensors of that step's shape, and prints each one's
measured time beside the time the planner gives it. (The output correction is TransformerEngine's
fused kernel; it is not reproduced here.)

    python launchers/plan_copies.py --device cuda   # a published ring step: 8K tokens, 64:8 x 128

A lab tool, not part of the package: its figures live in the profile
(``conf/hardware/h100_nvlink_ib.yaml``, ``sources:`` names this command).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lcab.plan.hardware import load_profile
from lcab.plan.harness import Copies, Elements, Passes


@dataclass(frozen=True)
class StepShape:
    """One rank's tensors in a ring step: ``tokens`` padded rows, ``valid`` of them real."""

    tokens: int = 8192
    valid: int = 8192
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128
    dtype: torch.dtype = torch.bfloat16

    def elements(self) -> Elements:
        """The harness's element counts for this step (every valid token active)."""
        q, kv = self.heads_q * self.head_dim, self.heads_kv * self.head_dim
        return Elements(self.tokens * q, self.tokens * kv, self.valid * q, self.valid * kv)


#: The planner's copies for each probed operation (together the harness's ``ring_fwd``; the
#: output correction after the ring, ``ring_merge_fwd``, is not probed): a gather reads and
#: writes each active element; the pad zero-fills the whole output, then scatters the active
#: rows into it.
PROBED_PASSES: dict[str, Copies] = {
    "unpad q": Copies(gathers=Passes(active_q=(2, 0))),
    "unpad k, v": Copies(gathers=Passes(active_kv=(4, 0))),
    "pad out": Copies(Passes(q=(1, 0)), scatters=Passes(active_q=(2, 0))),
    "pad lse": Copies(),  # [heads, tokens] float32: not costed by the planner
    "merge lse": Copies(),  # likewise
}


def unpad(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows ``index`` of ``x``, as ``fa_varlen_thd_unpad`` takes them (expanded index)."""
    return torch.gather(x, 0, index[:, None, None].expand(-1, x.shape[1], x.shape[2]))


def pad(x: torch.Tensor, index: torch.Tensor, tokens: int) -> torch.Tensor:
    """``x`` scattered to rows ``index`` of zeros, as ``fa_varlen_thd_pad`` does."""
    padded = torch.zeros(tokens, *x.shape[1:], device=x.device, dtype=x.dtype)
    return padded.scatter_(0, index[:, None, None].expand(-1, *x.shape[1:]), x)


def pad_lse(lse: torch.Tensor, index: torch.Tensor, tokens: int) -> torch.Tensor:
    """[heads, valid] LSE scattered into [heads, tokens] of -inf (``fa_varlen_lse_pad``)."""
    padded = torch.full((lse.shape[0], tokens), float("-inf"), device=lse.device, dtype=lse.dtype)
    return padded.scatter_(-1, index[None, :].expand(lse.shape[0], -1), lse)


def merge_lse(merged: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``merged`` <- log(exp(merged) + exp(step)), in place, as the baselines' LSE correction."""
    high, low = torch.max(merged, step), torch.min(merged, step)
    return merged.copy_(high + torch.log1p(torch.exp(low - high)))


def operations(shape: StepShape, device: str) -> dict[str, Callable[[], object]]:
    """The probed operations on random tensors of ``shape``, keyed as `PROBED_PASSES`."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*size: int, dtype: torch.dtype = shape.dtype) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=dtype)

    t, h, g, d = shape.tokens, shape.heads_q, shape.heads_kv, shape.head_dim
    q, k, v = rand(t, h, d), rand(t, g, d), rand(t, g, d)
    out, lse = rand(shape.valid, h, d), rand(h, shape.valid, dtype=torch.float32)
    merged, step_lse = rand(h, t, dtype=torch.float32), rand(h, t, dtype=torch.float32)
    # the valid rows of the padded layout, spread over it as padded documents leave them
    index = torch.linspace(0, t - 1, shape.valid, device=device).round().long()
    return {
        "unpad q": lambda: unpad(q, index),
        "unpad k, v": lambda: (unpad(k, index), unpad(v, index)),  # two calls, as theirs
        "pad out": lambda: pad(out, index, t),
        "pad lse": lambda: pad_lse(lse, index, t),
        "merge lse": lambda: merge_lse(merged, step_lse),
    }


def median_ms(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median wall time of ``fn`` in ms (device events on CUDA), after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - began))
    return statistics.median(times)


def probe(
    shape: StepShape,
    device: str,
    memory_gbps: float,
    repeats: int = 20,
    gather_efficiency: float = 1.0,
    scatter_efficiency: float = 1.0,
) -> list[tuple[str, float, float, float]]:
    """(operation, modelled MB, measured ms, modelled ms) per probed operation.

    Gathers are modelled at ``gather_efficiency`` of the rate, scatters at
    ``scatter_efficiency``, the rest (zero-fills) at the full rate, as the planner costs them.
    """
    rows = []
    elem = torch.finfo(shape.dtype).bits // 8
    for name, fn in operations(shape, device).items():
        moved = PROBED_PASSES[name].bytes(shape.elements(), elem, 4)
        modelled = (
            moved.plain / memory_gbps
            + moved.gathers / (memory_gbps * gather_efficiency)
            + moved.scatters / (memory_gbps * scatter_efficiency)
        )
        measured = median_ms(fn, device, repeats)
        rows.append((name, moved.total / 1e6, measured, 1e3 * modelled / 1e9))
    return rows


def main(argv: list[str]) -> int:
    """Print the probe's table (exit 2 on a device that is not available)."""
    parser = argparse.ArgumentParser(prog="python launchers/plan_copies.py", description=__doc__)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--hardware", default=None, help="profile (default: h100 on cuda)")
    parser.add_argument("--tokens", type=int, default=StepShape.tokens)
    parser.add_argument("--valid", type=int, default=None, help="real rows (default: all)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("plan_copies: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    valid = args.valid or args.tokens
    if not 0 < valid <= args.tokens:
        print(f"plan_copies: --valid={valid} must be in 1..--tokens={args.tokens}", file=sys.stderr)
        return 2
    default = "h100_nvlink_ib" if args.device == "cuda" else "cpu_gloo_local"
    hardware = load_profile(args.hardware or default)
    shape = StepShape(tokens=args.tokens, valid=valid)
    rows = probe(
        shape,
        args.device,
        hardware.memory_gbps,
        args.repeats,
        hardware.gather_efficiency,
        hardware.scatter_efficiency,
    )
    print(f"{'operation':<12} {'MB':>9} {'measured ms':>12} {'planner ms':>11}  ({hardware.name})")
    for name, mb, measured, modelled in rows:
        print(f"{name:<12} {mb:>9.1f} {measured:>12.3f} {modelled:>11.3f}")
    total = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"{'total':<12} {'':>9} {total[0]:>12.3f} {total[1]:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
