"""A kernel call's own autograd graph, kept inside a custom Function and differentiated on demand.

Ulysses and Ring All-Gather wrap the local call in an autograd Function (to time its backward,
or run collectives around it) but let autograd differentiate the call itself, on detached
leaves: `torch.autograd.grad` with ``retain_graph``, as benchmarks repeat the backward of one
forward and nothing may accumulate in ``.grad`` between repetitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def detached_leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh leaves sharing the tensors' storage, requiring grad (roots of the inner graph)."""
    return [t.detach().requires_grad_(True) for t in tensors]


def leaf_grads(
    out: torch.Tensor, leaves: list[torch.Tensor], dout: torch.Tensor
) -> list[torch.Tensor]:
    """d(out)/d(leaf) · dout for every leaf; zeros for leaves ``out`` does not depend on."""
    found = torch.autograd.grad(out, leaves, dout, retain_graph=True, allow_unused=True)
    return [g if g is not None else torch.zeros_like(t) for g, t in zip(found, leaves, strict=True)]
