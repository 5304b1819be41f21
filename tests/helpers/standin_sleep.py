"""A stand-in kernel whose pass times are sleeps: a normal cell, or one slowed on purpose.

The forward returns ``q`` (a copy; no attention is computed: only timings are wanted) after
sleeping ``fwd_s``; the output goes through an autograd function whose backward sleeps
``bwd_s``, so a timed backward (``out.backward``) takes that long. A sleep costs no CPU, so the
pass times it sets hold on a loaded machine, where a real kernel's would not.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from lcab.kernels import KernelCaps, PreparedAttention, Problem
from lcab.kernels.base import Kernel
from lcab.masks import AttnMask


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class _Sleeping(PreparedAttention):
    def __init__(self, fwd_s: float, bwd_s: float) -> None:
        self.fwd_s, self.bwd_s = fwd_s, bwd_s

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        time.sleep(self.fwd_s)
        lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)
        return _SleepInBackward.apply(q * 1.0, self.bwd_s), lse


def sleeping_kernel(fwd_s: float, bwd_s: float) -> Kernel:
    """A CPU float32 kernel whose forward and backward each sleep the given seconds."""

    class Sleeping(Kernel):
        name = "sleeping"
        caps = KernelCaps(
            devices=frozenset({"cpu"}),
            dtypes=frozenset({"float32"}),
            lowering="dense",
            backward_devices=frozenset({"cpu"}),
        )

        def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
            return _Sleeping(fwd_s, bwd_s)

    return Sleeping()
