"""What every adapter contract test (tests/unit/test_adapter_*.py) does the same way.

Random packed inputs for a mask and the forward + backward of any attention callable, so each
adapter's test file holds only what is specific to its library: the stand-in, the cases, the
library's layouts and conventions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lcab.masks import AttnMask


def tensors(
    mask: AttnMask, hq: int, hkv: int, dtype: torch.dtype, head_dim: int = 16, seed: int = 11
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded packed q (Sq, Hq, D), k, v (Sk, Hkv, D) and dout (Sq, Hq, D) for ``mask``."""
    gen = torch.Generator().manual_seed(seed)
    sq, sk = mask.shape
    q = torch.randn(sq, hq, head_dim, generator=gen, dtype=dtype)
    k = torch.randn(sk, hkv, head_dim, generator=gen, dtype=dtype)
    v = torch.randn(sk, hkv, head_dim, generator=gen, dtype=dtype)
    dout = torch.randn(sq, hq, head_dim, generator=gen, dtype=dtype)
    return q, k, v, dout


def forward_backward(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """(out, lse, (dq, dk, dv)) of ``fn(q, k, v)`` with ``dout`` as the output's gradient."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), lse.detach(), grads
