"""Measure what a FlashAttention varlen kernel pays per launched thread block that has no work.

The planner charges a varlen backward for the blocks its grid launches beyond the real work
(`model.CostModel.empty_blocks_s`): the grid is sized by the call's longest sequence for every
sequence, so a call with many short or empty documents launches mostly blocks that read their
sequence's length and exit. The H100 profile's ``bwd_empty_block_us`` was borrowed from a B-class
GPU's forward until this command measured it on a Hopper GPU (0.97, its sources say how). It
times the quantity on a CUDA machine, by default with torch's own FlashAttention-2 varlen
kernels (``torch.nn.attention.varlen.varlen_attn``; nothing to install): one sequence of
``--tokens`` tokens, then the same with B empty sequences appended (repeated ``cu_seqlens``
entries, as the published baselines pass padded documents). The slope of time against B,
× multiprocessors / (ceil(tokens / block) × query heads), is the SM-µs one empty block costs —
the profile's unit. FA2's kernels, not FA3's: the same grid shape (key blocks × sequences ×
heads, 128 keys per backward block at head dim 128) and the same early exit, but a different
kernel; a number measured here is a Hopper figure for that mechanism, not FA3's own.

    python launchers/plan_empty_blocks.py --device cuda   # 8K tokens, 64:8 heads x 128, bf16
    python launchers/plan_empty_blocks.py --kernel fa3    # the same with FlashAttention-3

A lab tool, not part of the package: its figure lives in the profile (``sources:`` names it).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lcab.kernels.torch_varlen import MODULE, api_reasons
from plan_copies import median_ms


@dataclass(frozen=True)
class EmptyBlockShape:
    """One real sequence of ``tokens`` tokens; ``heads_q``:``heads_kv`` heads of ``head_dim``."""

    tokens: int = 8192
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128
    causal: bool = True
    dtype: torch.dtype = torch.bfloat16

    def blocks_per_sequence(self, block: int) -> int:
        """Thread blocks one (sequence, head) gets when the grid is sized by ``tokens``."""
        return -(-self.tokens // block)


#: The varlen kernels this probe can time: torch's own (FA2's kernels inside torch, nothing to
#: install), flash-attn 2 (``flash_attn``) and FlashAttention-3 (``flash_attn_interface``, the
#: published baselines' kernel; a source build of flash-attention's ``hopper/``).
KERNELS = ("torch_varlen", "fa2", "fa3")
FLASH_MODULES = {"fa2": "flash_attn", "fa3": "flash_attn_interface"}

#: ``(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal) -> out`` for one
#: varlen call (the output, or a tuple that starts with it).
VarlenCall = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, bool], Any
]


def varlen_call(kernel: str) -> tuple[VarlenCall, bool]:
    """The kernel's varlen call and whether it takes grouped K/V heads (raises ImportError)."""
    if kernel in FLASH_MODULES:
        fn = importlib.import_module(FLASH_MODULES[kernel]).flash_attn_varlen_func

        def flash(
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            cu_q: torch.Tensor,
            cu_k: torch.Tensor,
            max_q: int,
            max_k: int,
            causal: bool,
        ) -> Any:
            scale = q.shape[-1] ** -0.5
            return fn(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal)

        return flash, True
    varlen: Any = importlib.import_module(MODULE)
    # torch < 2.12 has no enable_gqa: K/V are then repeated to every query head, which leaves
    # the grid (key blocks x sequences x query heads) and so the empty blocks unchanged
    gqa = "enable_gqa" in inspect.signature(varlen.varlen_attn).parameters

    def torch_varlen(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: int,
        max_k: int,
        causal: bool,
    ) -> Any:
        extra = {"enable_gqa": q.shape[1] != k.shape[1]} if gqa else {}
        window = (-1, 0) if causal else (-1, -1)
        scale = q.shape[-1] ** -0.5
        return varlen.varlen_attn(
            q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window, **extra
        )

    return torch_varlen, gqa


def kernel_reasons(kernel: str) -> list[str]:
    """Why ``kernel`` cannot be timed here (empty: it can)."""
    if kernel == "torch_varlen":
        return [r for r in api_reasons() if "enable_gqa" not in r]  # GQA: see varlen_call
    module = FLASH_MODULES[kernel]
    found = importlib.util.find_spec(module) is not None
    return [] if found else [f"--kernel {kernel} needs {module}, not installed"]


def time_calls(
    shape: EmptyBlockShape, empty: int, repeats: int, kernel: str = "torch_varlen"
) -> tuple[float, float]:
    """(forward ms, backward ms) of one call: the real sequence and ``empty`` empty ones."""
    call, gqa = varlen_call(kernel)
    gen = torch.Generator(device="cuda").manual_seed(0)
    t, d = shape.tokens, shape.head_dim

    def leaf(heads: int) -> torch.Tensor:
        x = torch.randn(t, heads, d, generator=gen, device="cuda", dtype=shape.dtype)
        return x.requires_grad_(True)

    kv_heads = shape.heads_kv if gqa else shape.heads_q
    q, k, v = leaf(shape.heads_q), leaf(kv_heads), leaf(kv_heads)
    cu = torch.tensor([0] + [t] * (1 + empty), dtype=torch.int32, device="cuda")

    def forward() -> torch.Tensor:
        result = call(q, k, v, cu, cu, t, t, shape.causal)
        out: torch.Tensor = result[0] if isinstance(result, tuple) else result
        return out

    out = forward()
    grad = torch.randn(out.shape, generator=gen, device="cuda", dtype=shape.dtype)
    with torch.no_grad():
        fwd = median_ms(forward, "cuda", repeats)
    bwd = median_ms(
        lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), "cuda", repeats
    )
    return fwd, bwd


def us_per_block(
    empties: list[int], ms: list[float], blocks_per_empty: int, multiprocessors: int
) -> float:
    """SM-µs per empty block.

    The least-squares slope of ms against empty sequences, spread over the blocks each empty
    sequence adds, × the multiprocessors that run them in parallel.
    """
    slope_ms = float(np.polyfit(np.asarray(empties, float), np.asarray(ms, float), 1)[0])
    return 1e3 * slope_ms * multiprocessors / blocks_per_empty


def main(argv: list[str]) -> int:
    """Print each call's time and the fitted cost per empty block (exit 2 without CUDA)."""
    parser = argparse.ArgumentParser(
        prog="python launchers/plan_empty_blocks.py", description=__doc__
    )
    parser.add_argument("--device", default="cuda", choices=["cuda"])
    parser.add_argument("--kernel", default="torch_varlen", choices=KERNELS)
    parser.add_argument("--tokens", type=int, default=EmptyBlockShape.tokens)
    parser.add_argument("--empty", type=int, nargs="+", default=[0, 32, 128, 512])
    parser.add_argument("--fwd-block", type=int, default=128, help="query rows per fwd block")
    parser.add_argument("--bwd-block", type=int, default=128, help="key columns per bwd block")
    parser.add_argument("--full", action="store_true", help="full mask (default: causal)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("plan_empty_blocks: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    reasons = kernel_reasons(args.kernel)
    if reasons:
        print(f"plan_empty_blocks: {'; '.join(reasons)}", file=sys.stderr)
        return 2
    if args.tokens < 1 or len(set(args.empty)) < 2 or min(args.empty) < 0:
        print(
            f"plan_empty_blocks: --tokens={args.tokens} must be >= 1 and --empty={args.empty} "
            "needs two or more distinct counts >= 0",
            file=sys.stderr,
        )
        return 2
    shape = EmptyBlockShape(tokens=args.tokens, causal=not args.full)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [(n, *time_calls(shape, n, args.repeats, args.kernel)) for n in args.empty]
    print(f"{torch.cuda.get_device_name(0)}, {sms} SMs, torch {torch.__version__}, {args.kernel}")
    print(shape)
    print(f"{'empty seqs':>10} {'fwd ms':>9} {'bwd ms':>9}")
    for n, fwd, bwd in rows:
        print(f"{n:>10} {fwd:>9.3f} {bwd:>9.3f}")
    empties = [r[0] for r in rows]
    for name, col, block in (("fwd", 1, args.fwd_block), ("bwd", 2, args.bwd_block)):
        blocks = shape.blocks_per_sequence(block) * shape.heads_q
        cost = us_per_block(empties, [r[col] for r in rows], blocks, sms)
        print(f"{name}: {cost:.3f} SM-us per empty block ({blocks} blocks per empty sequence)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
