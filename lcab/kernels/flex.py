"""FlexAttention with lcab's BlockMask lowering (built from slices, not from a predicate scan).

``compile=True`` (default) times compilation as setup. torch 2.13 has no Flex backward on CPU,
and its compiled CPU path returns no LSE (numerics then check the output only). Flex's LSE is
differentiable, so the generic backward from merged statistics serves ring CP, on CUDA.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lcab.kernels.base import Kernel, Output, PreparedAttention, Problem, lse_dtype, torch_caps
from lcab.kernels.registry import register_kernel
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering.flex import FLEX_BLOCK, flex_block_mask

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())


@cache
def _flex_fn(compiled: bool) -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    # One compiled graph per shape and mask structure; sweeps change both, so allow many
    # entries instead of Dynamo's default of 8 (after which it silently falls back to eager).
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    return torch.compile(flex_attention, dynamic=False)


class PreparedFlex(PreparedAttention):
    """One FlexAttention call with a ready BlockMask (shared by ``flex`` and ``sparse_flex``)."""

    layout = "bhsd"
    lse_grad = True  # `lcab.kernels.upstream.torch_flex`: aux.lse is differentiable

    def __init__(self, block_mask: Any, problem: Problem, compiled: bool) -> None:
        self.block_mask = block_mask
        self.fn = _flex_fn(compiled)
        self.scale = problem.head_dim**-0.5
        self.gqa = problem.heads_q != problem.heads_kv
        from torch.nn.attention.flex_attention import AuxRequest

        self.aux = AuxRequest(lse=True)
        self.with_lse = not (compiled and problem.device_type == "cpu")

    @override
    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        if q.device.type == "cpu":  # forward only on CPU; Flex refuses inputs that need grad
            q, k, v = q.detach(), k.detach(), v.detach()
        args = {"block_mask": self.block_mask, "scale": self.scale, "enable_gqa": self.gqa}
        if not self.with_lse:
            return self.fn(q, k, v, **args), None
        out, aux = self.fn(q, k, v, **args, return_aux=self.aux)
        return out, aux.lse[0].to(lse_dtype(q.dtype))


@dataclass
class FlexOptions:
    """Options of the flex kernels."""

    compile: bool = True
    """Run torch.compile(flex_attention) (the intended use); False runs eager (slow, tests)."""
    block_size: int = FLEX_BLOCK
    """Tile size of the BlockMask (FlexAttention's default is 128)."""


FLEX_CAPS = torch_caps("flex", backward_devices=frozenset({"cuda"}))  # LSE differentiable
"""What FlexAttention runs: any device, any float dtype, backward on CUDA only."""


class FlexFamily(Kernel):
    """FlexAttention kernels: they differ only in how the BlockMask is built (`block_mask`)."""

    options_cls = FlexOptions
    caps = FLEX_CAPS

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        if pass_ != "fwd" and problem.device_type == "cpu":
            return ["PyTorch's FlexAttention has no backward on CPU"]
        return []

    @override
    def not_supported_reasons(
        self, problem: Problem, mask: AttnMask | None = None, pass_: str = "fwd"
    ) -> list[str]:
        reasons = super().not_supported_reasons(problem, mask, pass_)
        # the precise CPU reason replaces the generic "no backward on cpu" one
        return [r for r in reasons if not r.startswith("no backward pass on cpu")]

    def returns_lse(self, device_type: str) -> bool:
        """No LSE from the compiled CPU path (see the module docstring)."""
        return not (self.options["compile"] and device_type == "cpu")

    @abstractmethod
    def block_mask(self, mask: AttnMask, problem: Problem) -> Any:
        """The BlockMask this kernel calls FlexAttention with."""

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        return PreparedFlex(self.block_mask(mask, problem), problem, bool(self.options["compile"]))


@register_kernel
class FlexKernel(FlexFamily):
    """torch FlexAttention; options: compile (bool, default True), block_size (default 128)."""

    name = "flex"
    colour = "#d62728"
    gpu_compared = True
    summary = "FlexAttention, BlockMask from slices, compiled"

    @override
    def block_mask(self, mask: AttnMask, problem: Problem) -> Any:
        return flex_block_mask(
            mask,
            heads_q=problem.heads_q,
            block_size=int(self.options["block_size"]),
            device=problem.device,
        )
