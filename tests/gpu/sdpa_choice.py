"""SDPA's backend choice three ways on one GPU: PyTorch's, lcab's, and the profiler's kernels.

``python -m tests.gpu.sdpa_choice [--out FILE]`` (what `launchers/gpu_check.sh` runs) takes, for
each problem (``causal`` through ``is_causal``, ``causal_document`` as a dense mask; GQA 64:8 and
MHA 64:64; bf16, 128 per head, 8K tokens) and each grad mode:

* ``torch``: ``torch._fused_sdp_choice`` on the real CUDA tensors;
* ``lcab``: what the unpinned ``sdpa`` kernel pins (`lcab.kernels.sdpa`), after one call of
  each grad mode;
* ``profiler``: the CUDA kernels that a plain ``F.scaled_dot_product_attention`` of the same
  arguments launches under ``torch.profiler``, named to a backend by their kernel names.

Each problem prints one line and, with ``--out``, one JSON line; ``agree`` is true when all three
name the same backend. Exit 1 when any differ (lcab must then follow PyTorch), 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lcab.kernels import Problem, get_kernel
from lcab.masks import make_mask

SEQLEN, HEAD_DIM = 8192, 128
PROBLEMS = (
    ("causal", 64, 8),
    ("causal", 64, 64),
    ("causal_document", 64, 8),
    ("causal_document", 64, 64),
)
"""(mask, query heads, key/value heads)."""
KERNEL_NAMES = (
    # substrings of CUDA kernel names in PyTorch 2.x builds, by backend (lower case)
    ("CUDNN_ATTENTION", ("cudnn", "sm90_flash", "cutlass3x_sm90")),
    ("FLASH_ATTENTION", ("flash_fwd", "flash_bwd", "pytorch_flash")),
    ("EFFICIENT_ATTENTION", ("fmha_cutlass", "attention_kernel", "mem_eff")),
)


def backend_of(kernels: list[str]) -> str:
    """The backend whose kernel names appear in a trace; MATH when none of the fused ones do."""
    lowered = [k.lower() for k in kernels]
    for backend, marks in KERNEL_NAMES:
        if any(mark in name for name in lowered for mark in marks):
            return backend
    return "MATH"


def traced_kernels(fn: Callable[[], None]) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()  # outside the trace: first-call setup
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def check(mask_name: str, heads_q: int, heads_kv: int) -> dict[str, Any]:
    """One problem: the three answers per grad mode and whether they agree."""
    dev, dtype = torch.device("cuda"), torch.bfloat16
    problem = Problem(SEQLEN, SEQLEN, heads_q, heads_kv, HEAD_DIM, dtype, dev)
    mask = make_mask(mask_name, SEQLEN, seed=0)
    prepared = get_kernel("sdpa").prepare(mask, problem)
    gen = torch.Generator(device=dev).manual_seed(0)
    shapes = {"q": heads_q, "k": heads_kv, "v": heads_kv}
    packed = {
        n: torch.randn(SEQLEN, h, HEAD_DIM, generator=gen, device=dev, dtype=dtype)
        for n, h in shapes.items()
    }
    bias, is_causal = prepared.bias, prepared.is_causal  # type: ignore[attr-defined]
    scale, gqa = 1.0 / math.sqrt(HEAD_DIM), heads_q != heads_kv
    row: dict[str, Any] = {
        "mask": mask_name,
        "heads_q": heads_q,
        "heads_kv": heads_kv,
        "seqlen": SEQLEN,
        "head_dim": HEAD_DIM,
        "dtype": "bfloat16",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    agree = True
    for grad in (False, True):
        q, k, v = (prepared.to_native(packed[n]).detach().requires_grad_(grad) for n in "qkv")
        torch_choice = torch.nn.attention.SDPBackend(
            torch._fused_sdp_choice(q, k, v, bias, 0.0, is_causal, scale=scale, enable_gqa=gqa)
        ).name
        prepared.run(q, k, v)
        lcab_choice = prepared.choices.get(grad)  # type: ignore[attr-defined]

        def plain(
            q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, grad: bool = grad
        ) -> None:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, is_causal=is_causal, scale=scale, enable_gqa=gqa
            )
            if grad:
                out.backward(torch.ones_like(out))

        kernels = traced_kernels(plain)
        seen = backend_of(kernels)
        key = "bwd" if grad else "fwd"
        row[key] = {
            "torch": torch_choice,
            "lcab": lcab_choice,
            "profiler": seen,
            "kernels": [k[:120] for k in kernels],
        }
        agree &= torch_choice == lcab_choice == seen
        del q, k, v
    row["agree"] = agree
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.sdpa_choice")
    parser.add_argument("--out", help="append one JSON line per problem")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("sdpa_choice: no CUDA device; nothing to check", file=sys.stderr)
        return 2
    differ = 0
    for mask_name, hq, hkv in PROBLEMS:
        try:
            row = check(mask_name, hq, hkv)
        except Exception as err:  # one problem's failure is its row, not the end of the check
            row = {
                "mask": mask_name,
                "heads_q": hq,
                "heads_kv": hkv,
                "agree": False,
                "error": f"{type(err).__name__}: {str(err)[:300]}",
            }
        differ += not row["agree"]
        passes = " | ".join(
            f"{p}: torch {row[p]['torch']}, lcab {row[p]['lcab']}, profiler {row[p]['profiler']}"
            for p in ("fwd", "bwd")
            if p in row
        )
        print(f"{mask_name} {hq}:{hkv} agree={row['agree']} {passes or row.get('error')}")
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        torch.cuda.empty_cache()
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
