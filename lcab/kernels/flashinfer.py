"""``sparse_flashinfer``: FlashInfer's block-sparse wrappers (forward only), block-table lowering.

CPU contract-tested only; wrappers, parameters and LSE facts (log2 units) are the rows of
`lcab.kernels.upstream.flashinfer`. A head-shared mask → ``BlockSparseAttentionWrapper`` on a
``block_size`` grid (inputs zero-padded to whole blocks); an element mask forces FlashInfer's
FA2 backend and costs nnz·R·C bytes, so it is bounded by `ELEMENT_MASK_LIMIT`. Per-KV-head masks
→ ``VariableBlockSparseAttentionWrapper`` (no element mask: heads whose tiles are not all full
are refused). Empty rows are set from the mask, FlashInfer's value being undocumented.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lcab.kernels.base import (
    Kernel,
    Output,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
    lse_dtype,
)
from lcab.kernels.flashinfer_lowering import (
    bsr_args,
    bsr_mode,
    padded_length,
    per_head_partition_reason,
    variable_args,
)
from lcab.kernels.library_results import LibraryCall, lse_reading
from lcab.kernels.packages import ApiNeed, PackageProbe
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream import flashinfer as upstream
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering.blocks import BlockTable, block_table

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())

BSR_LSE = lse_reading(upstream.BSR_RUN)
VARIABLE_LSE = lse_reading(upstream.VARIABLE_RUN)
#: Largest element mask (nnz·R·C booleans) lcab builds; FlashInfer copies and packs it on the
#: GPU in ``plan``, so this is about 2 × 4 GiB of transient device memory.
ELEMENT_MASK_LIMIT = 2**32
#: The workspace FlashInfer's examples allocate (128 MiB).
WORKSPACE_BYTES = 128 * 1024 * 1024

BSR_PLAN_KWARGS = (
    "indptr", "indices", "M", "N", "R", "C", "num_qo_heads", "num_kv_heads", "head_dim",
    "mask", "causal", "sm_scale", "q_data_type", "kv_data_type", "o_data_type",
)  # fmt: skip
VARIABLE_PLAN_KWARGS = (
    "block_mask_map", "block_row_sz", "block_col_sz", "num_qo_heads", "num_kv_heads",
    "head_dim", "sm_scale", "q_data_type", "kv_data_type",
)  # fmt: skip


@dataclass
class FlashInferOptions:
    """Options of the sparse_flashinfer kernel."""

    block_size: int = 128
    """BSR block size R = C of head-shared masks (per-head masks use their own partitions)."""


class _PreparedBsr(LibraryCall):
    """A planned ``BlockSparseAttentionWrapper``; inputs zero-padded to whole blocks."""

    library = "FlashInfer BlockSparseAttentionWrapper"
    follows = "flashinfer-python 0.7 (lse (M, num_qo_heads), log2)"

    def __init__(
        self, module: Any, mask: AttnMask, table: BlockTable, problem: Problem, block: int
    ):
        self.block = block
        self.expect(mask, problem)
        self.wrapper = None
        if len(table.kv_block) == 0:  # nothing attended: FlashInfer's plan cannot take nnz = 0
            return
        args, device = bsr_args(mask, table, block), problem.device
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = getattr(module, upstream.BSR)(workspace, backend="auto")
        self.wrapper.plan(
            indptr=args.indptr.to(device),
            indices=args.indices.to(device),
            M=args.M,
            N=args.N,
            R=block,
            C=block,
            num_qo_heads=problem.heads_q,
            num_kv_heads=problem.heads_kv,
            head_dim=problem.head_dim,
            mask=None if args.element_mask is None else args.element_mask.to(device),
            causal=args.causal,
            sm_scale=problem.head_dim**-0.5,
            q_data_type=problem.dtype,
            kv_data_type=problem.dtype,
            o_data_type=problem.dtype,
        )

    @override
    def to_native(self, x: torch.Tensor) -> torch.Tensor:
        """Zero rows up to whole blocks (FlashInfer needs N divisible by C)."""
        missing = padded_length(x.shape[0], self.block) - x.shape[0]
        return x if missing == 0 else torch.cat([x, x.new_zeros(missing, *x.shape[1:])])

    @override
    def from_native(self, x: torch.Tensor) -> torch.Tensor:
        return x  # run already dropped the padded query rows

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        if self.wrapper is None:
            out = q.new_zeros(self.seqlen, self.heads, q.shape[-1])
            lse = torch.full((self.heads, self.seqlen), float("-inf"), device=q.device)
            return out, lse.to(lse_dtype(q.dtype))
        out, lse = self.wrapper.run(q, k, v, return_lse=True)
        factor, layout = BSR_LSE  # (M, Hq), log2
        return self.convention(out[: self.seqlen], lse[: self.seqlen] * factor, layout, q.dtype)


class _PreparedVariable(LibraryCall):
    """A planned ``VariableBlockSparseAttentionWrapper``: (H, S, D) tensors."""

    library = "FlashInfer VariableBlockSparseAttentionWrapper"
    follows = "flashinfer-python 0.7 (lse (num_qo_heads, qo_len), log2)"

    def __init__(self, module: Any, mask: AttnMask, problem: Problem) -> None:
        self.expect(mask, problem, per_query_head=True)
        self.wrapper = None
        if mask.num_slices == 0:  # nothing attended: plan cannot expand zero selected blocks
            return
        args = variable_args(mask)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=problem.device)
        self.wrapper = getattr(module, upstream.VARIABLE)(workspace, backend="auto")
        self.wrapper.plan(
            block_mask_map=args.block_mask_map.to(problem.device),
            block_row_sz=args.block_row_sz.to(problem.device),
            block_col_sz=args.block_col_sz.to(problem.device),
            num_qo_heads=problem.heads_q,
            num_kv_heads=problem.heads_kv,
            head_dim=problem.head_dim,
            sm_scale=problem.head_dim**-0.5,
            q_data_type=problem.dtype,
            kv_data_type=problem.dtype,
        )

    @override
    def to_native(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1).contiguous()  # (S, H, D) → (H, S, D)

    @override
    def from_native(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        if self.wrapper is None:
            lse = torch.full((self.heads, self.seqlen), float("-inf"), device=q.device)
            return torch.zeros_like(q), lse.to(lse_dtype(q.dtype))
        out, lse = self.wrapper.run(q, k, v, return_lse=True)
        factor, layout = VARIABLE_LSE  # (Hq, S), log2
        out, lse = self.convention(out.transpose(0, 1), lse * factor, layout, q.dtype)
        return out.transpose(0, 1), lse


@register_kernel
class FlashInferSparseKernel(Kernel):
    """FlashInfer block-sparse attention (BSR + element masks, or per-head variable blocks)."""

    name = "sparse_flashinfer"
    colour = "#a55194"
    summary = (
        "FlashInfer block-sparse wrappers (BSR + element masks; per-head variable blocks), fwd"
    )
    options_cls = FlashInferOptions
    caps = cuda_adapter_caps(
        "block_table",
        backward=False,
        head_dims=frozenset({64, 128, 256}),
        per_head_masks=True,
        requires=PackageProbe(
            module=upstream.MODULE,
            distributions=(upstream.DISTRIBUTION, "flashinfer"),
            install='pip install "lcab[flashinfer]"',
            note="forward only; JIT-compiles with nvcc on first use",
            needs=(
                ApiNeed(upstream.BSR_INIT.name, ("backend",), positional=1),
                ApiNeed(upstream.BSR_PLAN.name, BSR_PLAN_KWARGS, positional=1),
                ApiNeed(upstream.BSR_RUN.name, ("return_lse",), positional=4),
                ApiNeed(upstream.VARIABLE_INIT.name, ("backend",), positional=1),
                ApiNeed(upstream.VARIABLE_PLAN.name, VARIABLE_PLAN_KWARGS, positional=1),
                ApiNeed(upstream.VARIABLE_RUN.name, ("return_lse",), positional=4),
            ),
            min_version="0.2.7",
            requirement=">= 0.2.7 (VariableBlockSparseAttentionWrapper)",
        ),
        min_compute_capability=(8, 0),
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._table: tuple[AttnMask, BlockTable] | None = None

    @property
    def block_size(self) -> int:
        """The BSR block size R = C."""
        return int(self.options["block_size"])

    def shared_table(self, mask: AttnMask) -> BlockTable:
        """The block table of a head-shared mask (cached: reasons and prepare both need it)."""
        if self._table is None or self._table[0] is not mask:
            self._table = (mask, block_table(mask, self.block_size, self.block_size))
        return self._table[1]

    @override
    def not_supported_reasons(
        self, problem: Problem, mask: AttnMask | None = None, pass_: str = "fwd"
    ) -> list[str]:
        reasons = [
            r for r in super().not_supported_reasons(problem, mask, pass_)
            if not r.startswith("no backward pass")
        ]  # fmt: skip
        if pass_ in ("bwd", "fwd_bwd"):
            reasons.insert(0, "FlashInfer has no backward pass (forward-only kernels, no autograd)")
        return reasons

    @override
    def mask_reasons(self, mask: AttnMask) -> list[str]:
        why = self.mask_reason(mask)
        return super().mask_reasons(mask) + ([why] if why else [])

    def mask_reason(self, mask: AttnMask) -> str | None:
        """Why this mask cannot be planned (partial per-head tiles, element mask too big)."""
        if mask.num_heads > 1:
            why = per_head_partition_reason(mask)
            return None if why is None else f"per-KV-head mask not expressible: {why}"
        if self.block_size < 1:
            return f"block_size={self.block_size} must be >= 1"
        table = self.shared_table(mask)
        elements = len(table.kv_block) * self.block_size**2
        if elements > ELEMENT_MASK_LIMIT and bsr_mode(mask, table, self.block_size) == "element":
            return (
                f"FlashInfer's element mask for the {len(table.kv_block)} touched "
                f"{self.block_size}x{self.block_size} tiles would hold {elements} booleans "
                f"(lcab's limit {ELEMENT_MASK_LIMIT}): partly attended tiles other than causal "
                "diagonals (or keys padded to whole blocks) need a mask for every tile"
            )
        return None

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        if mask.num_heads > 1:
            return _PreparedVariable(module, mask, problem)
        return _PreparedBsr(module, mask, self.shared_table(mask), problem, self.block_size)
