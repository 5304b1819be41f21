"""The kernel contract: capabilities as data, reasons instead of crashes, setup apart from the call.

A kernel maps packed q (S, Hq, D), k/v (S, Hkv, D) to out (S, Hq, D) and lse (Hq, S), the
natural-log log-sum-exp in float32 (`lse_dtype`); a row with no key has out 0 and lse -inf.
``prepare`` (lowering, planning, compiling) is timed apart from ``PreparedAttention.run``, which
takes tensors in the kernel's native layout (converted outside the timer, as the paper does).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

from lcab.cell import DTYPE_NAMES, dtype_name, torch_dtype
from lcab.kernels.packages import PackageProbe, cuda_available, installed, probe_reasons
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering import lowering_reason

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

Layout = Literal["shd", "bhsd"]
Output: TypeAlias = "tuple[torch.Tensor, torch.Tensor | None]"
"""What a prepared call returns: out in its layout, and the LSE (Hq, Sq) or None."""
Grads: TypeAlias = "tuple[torch.Tensor, torch.Tensor, torch.Tensor]"
"""(dq, dk, dv)."""


@dataclass(frozen=True)
class Problem:
    """Shapes and placement of one attention call (batch 1, packed sequence)."""

    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype | str = field(default_factory=lambda: torch.float32)
    """A torch dtype, or its name: the planner asks about named problems without importing torch."""
    device: torch.device | str = field(default_factory=lambda: torch.device("cpu"))
    """A torch device, or its type (``cpu``, ``cuda``) for a named problem."""

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor) -> Problem:
        """The problem of packed tensors q (Sq, Hq, D) and k (Sk, Hkv, D)."""
        return cls(q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2], q.dtype, q.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as torch's (imports torch for a named problem)."""
        return torch_dtype(self.dtype) if isinstance(self.dtype, str) else self.dtype

    @property
    def torch_device(self) -> torch.device:
        """The device as torch's (imports torch for a named problem)."""
        return torch.device(self.device) if isinstance(self.device, str) else self.device

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda``, for a named problem too."""
        return self.device if isinstance(self.device, str) else self.device.type

    @property
    def dtype_name(self) -> str:
        """``float32``, ``bfloat16``, ...: the name configs and records use."""
        return dtype_name(self.dtype)

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head."""
        return self.heads_q // self.heads_kv


@dataclass(frozen=True)
class KernelCaps:
    """What a kernel supports, as data (xformers' SUPPORTED_* idea)."""

    devices: frozenset[str]
    """Device types it runs on ("cpu", "cuda")."""
    dtypes: frozenset[str]
    """Input dtypes it accepts, by name (`lcab.cell.DTYPE_NAMES`): known without importing torch."""
    lowering: str
    """Mask form it consumes (a name of `lcab.masks.lowering.LOWERING_REASONS`)."""
    backward_devices: frozenset[str] = frozenset()
    """Device types with a backward pass (empty: forward only)."""
    max_head_dim: int | None = None
    """Largest head dim (None: any)."""
    head_dims: frozenset[int] | None = None
    """Exact head dims supported (None: any up to max_head_dim)."""
    gqa: bool = True
    """Whether Hq != Hkv works without the caller repeating K/V."""
    per_head_masks: bool = False
    """Whether a different mask per KV head (dynamic block-sparse) is accepted."""
    returns_lse: bool = True
    """Whether `run` returns the log-sum-exp (context parallelism needs it)."""
    requires: PackageProbe | None = None
    """The optional package it calls and what the adapter needs of it."""
    min_compute_capability: tuple[int, int] | None = None
    """Lowest CUDA compute capability."""
    contract_tested: bool = False
    """A CUDA-only adapter whose call path is tested on CPU against a stand-in (`proof_on_cpu`)."""
    stats_backward: bool = False
    """Whether `PreparedAttention.backward` works (gradients under merged statistics, for rings)."""

    @property
    def package(self) -> str | None:
        """Import name of the optional package it calls (None: torch's or lcab's own)."""
        return self.requires.name if self.requires else None


HALF_PRECISION = frozenset({"float16", "bfloat16"})
"""The dtypes of the CUDA attention libraries."""


def torch_caps(lowering: str, **fields: Any) -> KernelCaps:
    """Capabilities of a kernel of plain torch ops: everything, narrowed by ``fields``."""
    defaults: dict[str, Any] = {
        "devices": frozenset({"cpu", "cuda"}),
        "dtypes": frozenset(DTYPE_NAMES),
        "backward_devices": frozenset({"cpu", "cuda"}),
        "per_head_masks": True,
        "stats_backward": True,
    }
    return KernelCaps(lowering=lowering, **(defaults | fields))


def cuda_adapter_caps(lowering: str, *, backward: bool = True, **fields: Any) -> KernelCaps:
    """Capabilities of a contract-tested CUDA fp16/bf16 adapter; ``fields`` sets its limits."""
    defaults: dict[str, Any] = {
        "devices": frozenset({"cuda"}),
        "dtypes": HALF_PRECISION,
        "backward_devices": frozenset({"cuda"}) if backward else frozenset(),
        "contract_tested": True,
    }
    return KernelCaps(lowering=lowering, **(defaults | fields))


class PreparedAttention(ABC):
    """A kernel bound to one mask and problem: everything but the timed call is done."""

    layout: ClassVar[Layout] = "shd"
    lse_grad: ClassVar[bool] = False
    """Whether the LSE of `run` carries its gradient to q, k, v (the generic `backward` needs it).

    Declared per class from the library's source: FA2, FA3, FFA and FlashMask return an LSE with
    ``requires_grad=True`` whose gradient their backward ignores."""

    def to_native(self, x: torch.Tensor) -> torch.Tensor:
        """Packed (S, H, D) → the kernel's layout (outside the timer)."""
        return x if self.layout == "shd" else x.transpose(0, 1).unsqueeze(0)

    def from_native(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel's layout → packed (S, H, D)."""
        return x if self.layout == "shd" else x.squeeze(0).transpose(0, 1)

    def lse_from_native(self, lse: torch.Tensor) -> torch.Tensor:
        """The LSE as (Hq, Sq) over the whole sequence (identity on one device)."""
        return lse

    def backward(
        self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
    ) -> Grads:
        """(dq, dk, dv) of this block of keys when the row's merged result is (out, lse).

        By autograd through `run`: with w = exp(l_b - lse), o_b's gradient is w·dout and l_b's
        w·(rowsum(dout·o_b) - rowsum(dout·out)), i.e. P_global ⊙ (dP - delta) on the block.
        """
        if not self.lse_grad:
            raise NotImplementedError(
                f"{type(self).__name__} has no backward from merged softmax statistics (its "
                "library's LSE carries no gradient)"
            )
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            block_out, block_lse = self.run(*leaves)
            if block_lse is None or not block_lse.requires_grad:
                raise NotImplementedError(
                    f"{type(self).__name__} has no backward from merged softmax statistics"
                )
            finite = torch.isfinite(lse)
            weight = torch.where(
                finite, torch.exp(block_lse.detach() - torch.where(finite, lse, 0.0)), 0.0
            )
            w_out = _rows_to_layout(weight, self.layout, block_out.dtype)
            dot_block = _row_dot(dout, block_out.detach(), self.layout)
            dot_total = _row_dot(dout, out, self.layout)
            grad_lse = weight * (dot_block - dot_total)
            torch.autograd.backward([block_out, block_lse], [dout * w_out, grad_lse])
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]
        return grads[0], grads[1], grads[2]

    @abstractmethod
    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        """(out, lse) for native-layout inputs; out in native layout, lse (Hq, Sq) float32."""


class Kernel(ABC):
    """A registered attention kernel: subclasses set ``name``, ``caps``, ``colour``, `prepare`."""

    name: ClassVar[str]
    caps: ClassVar[KernelCaps]
    summary: ClassVar[str] = ""
    colour: ClassVar[str]
    """Its line colour in every report's plots (hex, unique, checked on registration)."""
    gpu_compared: ClassVar[bool] = False
    """One of the dense kernels lcab's GPU checks compare (support matrix, perf gpu-timer)."""
    options_cls: ClassVar[type | None] = None
    """Dataclass of the kernel's options (its Hydra config fields); None: no options."""
    rectangle_closed: ClassVar[bool] = True
    """Whether it takes every rectangle of a mask it takes (CP then checks the whole mask once).
    False for SDPA's flash backend (whole causal or full only) and whole-tile kernels."""

    def __init__(self, **options: Any) -> None:
        valid = [f.name for f in dataclasses.fields(self.options_cls)] if self.options_cls else []
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(
                f"unknown option(s) {', '.join(unknown)} for kernel {self.name!r}; "
                f"valid: {', '.join(valid) or '(none)'}"
            )
        resolved = dataclasses.asdict(self.options_cls(**options)) if self.options_cls else {}
        self.options: dict[str, Any] = resolved

    @property
    def module(self) -> str:
        """The module the adapter imports from its package."""
        if self.caps.requires is None:
            raise TypeError(f"kernel {self.name!r} calls no optional package")
        return self.caps.requires.module

    def environment_reasons(self, device: torch.device | str) -> list[str]:
        """Reasons tied to this machine: package missing, no CUDA, compute capability."""
        reasons = []
        cuda = (device if isinstance(device, str) else device.type) == "cuda"
        if cuda and not cuda_available():
            reasons.append("needs CUDA, and no CUDA device is visible on this machine")
        package = self.caps.requires
        if package and not installed(package):
            how = f" ({package.install})" if package.install else ""
            reasons.append(f"needs package '{package.name}', not installed{how}")
        if (
            self.caps.min_compute_capability
            and cuda
            and cuda_available()
            and torch.cuda.get_device_capability(device) < self.caps.min_compute_capability
        ):
            major, minor = self.caps.min_compute_capability
            reasons.append(f"needs compute capability >= {major}.{minor}")
        return reasons

    def not_supported_reasons(
        self, problem: Problem, mask: AttnMask | None = None, pass_: str = "fwd"
    ) -> list[str]:
        """Why this kernel cannot run ``pass_`` of ``problem`` (and ``mask``); empty if it can."""
        caps, reasons = self.caps, []
        device = problem.device_type
        if device not in caps.devices:
            if caps.devices == {"cuda"}:
                where = (
                    "none is visible on this machine"
                    if not cuda_available()
                    else f"this problem is on {device}"
                )
                reasons.append(f"needs a CUDA GPU ({where})")
            else:
                reasons.append(f"runs on {'/'.join(sorted(caps.devices))}, not {device}")
        if problem.dtype_name not in caps.dtypes:
            names = ", ".join(sorted(caps.dtypes))
            reasons.append(f"dtype {problem.dtype_name} unsupported ({names})")
        if caps.max_head_dim is not None and problem.head_dim > caps.max_head_dim:
            reasons.append(f"head_dim {problem.head_dim} > {caps.max_head_dim}")
        if caps.head_dims is not None and problem.head_dim not in caps.head_dims:
            reasons.append(f"head_dim {problem.head_dim} not in {sorted(caps.head_dims)}")
        if problem.heads_q != problem.heads_kv and not caps.gqa:
            reasons.append("no GQA (needs heads_q == heads_kv)")
        if pass_ in ("bwd", "fwd_bwd") and device not in caps.backward_devices:
            where = (
                f"only on {'/'.join(sorted(caps.backward_devices))}"
                if caps.backward_devices
                else "at all"
            )
            reasons.append(f"no backward pass on {device} (backward exists {where})")
        reasons.extend(self.package_reasons(problem.device))
        reasons.extend(self.extra_reasons(problem, pass_))
        if mask is not None:
            if mask.num_heads > 1 and not caps.per_head_masks:
                reasons.append(f"no per-KV-head masks (this mask has {mask.num_heads} heads)")
            elif mask.num_heads > 1 and mask.num_heads != problem.heads_kv:
                reasons.append(
                    f"mask has {mask.num_heads} heads, the problem {problem.heads_kv} KV heads"
                )
            else:
                reasons.extend(self.mask_reasons(mask))
        reasons.extend(self.environment_reasons(problem.device))
        return reasons

    def package_reasons(self, device: torch.device | str) -> list[str]:
        """Why the installed package does not fit the adapter (`lcab.kernels.packages`)."""
        return probe_reasons(self.caps.requires, device) if self.caps.requires else []

    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        """Kernel-specific static limits beyond `KernelCaps` (override when needed)."""
        return []

    def mask_reasons(self, mask: AttnMask) -> list[str]:
        """Why this kernel cannot take ``mask`` (one mask for all heads; CP asks per block)."""
        why = lowering_reason(mask, self.caps.lowering)
        return [] if why is None else [f"mask not expressible as {self.caps.lowering}: {why}"]

    def mask_refusals(self, problem: Problem, mask: AttnMask) -> list[str]:
        """The reasons this kernel gives for ``mask`` beyond those for ``problem`` alone (CP)."""
        if type(self).not_supported_reasons is Kernel.not_supported_reasons:
            return self.mask_reasons(mask)  # the base adds nothing else for a one-head mask
        if mask.num_heads > 1:  # asked as the problem its heads belong to (CP selects them)
            group = problem.heads_q // problem.heads_kv
            problem = dataclasses.replace(
                problem, heads_kv=mask.num_heads, heads_q=mask.num_heads * group
            )
        alone = set(self.not_supported_reasons(problem, None))
        return [r for r in self.not_supported_reasons(problem, mask) if r not in alone]

    def stats_backward_reasons(self, problem: Problem) -> list[str]:
        """Why there is no backward from merged softmax statistics for ``problem`` (CP rings)."""
        if self.caps.stats_backward:
            return []
        return [f"kernel {self.name!r} provides no backward from merged softmax statistics"]

    def returns_lse(self, device_type: str) -> bool:
        """Whether `run` returns the log-sum-exp on this device type."""
        return self.caps.returns_lse

    @abstractmethod
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        """Lower ``mask`` and plan the call (the benchmark times this as setup)."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of packed q, k, v under ``mask`` → (out, lse); ValueError with the reasons."""
        problem = Problem.of(q, k)
        check_shapes(q, k, v, mask)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        reasons = self.not_supported_reasons(problem, mask, "fwd_bwd" if needs_grad else "fwd")
        if reasons:
            raise ValueError(f"kernel {self.name!r} cannot run this: " + "; ".join(reasons))
        prepared = self.prepare(mask, problem)
        out, lse = prepared.run(prepared.to_native(q), prepared.to_native(k), prepared.to_native(v))
        return prepared.from_native(out), lse


def _rows_to_layout(w: torch.Tensor, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """Per-row weights (H, S) broadcastable against an output in ``layout``."""
    return (w.t().unsqueeze(-1) if layout == "shd" else w.unsqueeze(0).unsqueeze(-1)).to(dtype)


def _row_dot(a: torch.Tensor, b: torch.Tensor, layout: str) -> torch.Tensor:
    """Per-row dot products of two outputs in ``layout``, as (H, S) in float32 or wider."""
    prod = (a.to(lse_dtype(a.dtype)) * b.to(lse_dtype(a.dtype))).sum(-1)
    return prod.t() if layout == "shd" else prod[0]


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The LSE dtype for inputs of ``dtype``: float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask) -> None:
    """Raise ValueError unless q/k/v are packed (S, H, D) tensors matching ``mask``."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k, v must be packed (S, H, D) tensors (batch 1)")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must match, with q's head dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"heads_q={q.shape[1]} must be a multiple of heads_kv={k.shape[1]}")
    if (q.shape[0], k.shape[0]) != mask.shape:
        raise ValueError(f"mask shape {mask.shape} != (Sq, Sk) = {(q.shape[0], k.shape[0])}")


def empty_rows(mask: AttnMask) -> torch.Tensor:
    """Bool (H_mask, Sq): rows attending no key (their out is 0 and lse is -inf)."""
    ri = mask.row_intervals()
    counts = torch.from_numpy(ri.ptr[1:] - ri.ptr[:-1])
    return (counts == 0).reshape(mask.num_heads, mask.seqlen_q)


def proof_on_cpu(caps: KernelCaps) -> str:
    """What lcab has shown of a kernel without a GPU, for the support tables."""
    if "cpu" in caps.devices:
        return "runs on CPU (numerics vs fp64)"
    if caps.contract_tested:
        return "CPU contract-tested"
    return "not run (CUDA only)"
