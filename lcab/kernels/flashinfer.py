"""``sparse_flashinfer``: FlashInfer's block-sparse wrappers (forward only), block-table lowering.

Written against the documented API of ``flashinfer-python`` (>= 0.2.7, read at 0.6.18 and
0.7.2.post1; see the version probe) and **CPU contract-tested only**: the tests run this
adapter's whole path against stand-in classes implementing the documented semantics, never
against the real CUDA kernels. The first GPU run must confirm it.

Two wrappers, chosen by the mask:

* one mask for all heads → ``BlockSparseAttentionWrapper``: the BSR (``indptr``/``indices``,
  int32) of the tiles the mask touches on a ``block_size`` grid (R = C = block_size). When some
  touched tile is only partly attended, ``plan`` also gets the per-tile element ``mask``
  (nnz, R, C) — partial tiles from `BlockTable.partial_tile_masks`, full tiles all True — which
  makes the call exact for *any* mask, but a custom mask forces FlashInfer's FA2 backend (its
  FA3 path refuses custom masks) and costs nnz·R·C bytes in `prepare`, so masks whose element
  mask exceeds `ELEMENT_MASK_LIMIT` are refused. The API needs N divisible by C: ``to_native``
  zero-pads q, k and v to a multiple of block_size (outside the timer), the element mask keeps
  padded keys unattended, and ``run`` drops the padded query rows.
* one mask per KV head (``block_sparse``/``varblock_sparse`` with ``heads`` = Hkv) →
  ``VariableBlockSparseAttentionWrapper``, which has no element mask: each head's partition is
  the union of its slices' query/key edges, on which every rectangular slice is a union of whole
  tiles. The API wants the same block counts for all heads, so smaller partitions are refined
  by splitting their largest blocks (no zero-size blocks, which the docs do not cover). A head
  whose tiles cannot all be full (a causal band, say) is refused.

LSE: FlashInfer returns it in **log2** units (the kernel scales scores by log2 e); the BSR
wrapper as (M, Hq), the variable wrapper as (Hq, S). ``run`` multiplies by ln 2 and converts the
layout to lcab's (Hq, Sq); rows attending nothing are set from the mask (out 0, lse -inf), since
FlashInfer's value for them is undocumented. There is no backward (no autograd in FlashInfer).
"""

from __future__ import annotations

import heapq
import importlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from typing_extensions import override

from lcab.kernels.base import (
    Kernel,
    KernelCaps,
    PreparedAttention,
    Problem,
    empty_rows,
    lse_dtype,
)
from lcab.kernels.library_results import lse_to_lcab, to_lcab_convention
from lcab.kernels.probe import ApiNeed, PackageProbe, probe_reasons
from lcab.kernels.registry import register_kernel
from lcab.masks.core import AttnMask
from lcab.masks.geometry import IntArray, slice_areas
from lcab.masks.lowering.blocks import BlockTable, block_table

LN2 = math.log(2.0)
#: Largest element mask (nnz·R·C booleans) lcab builds; FlashInfer copies and packs it on the
#: GPU in ``plan``, so this is about 2 × 4 GiB of transient device memory.
ELEMENT_MASK_LIMIT = 2**32
#: The workspace FlashInfer's examples allocate (128 MiB).
WORKSPACE_BYTES = 128 * 1024 * 1024

BSR_PLAN_KWARGS = (
    "indptr", "indices", "M", "N", "R", "C", "num_qo_heads", "num_kv_heads", "head_dim",
    "mask", "sm_scale", "q_data_type", "kv_data_type", "o_data_type",
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


# ----------------------------------------------------------------------------- BSR (shared)
@dataclass(frozen=True)
class BsrArgs:
    """What ``BlockSparseAttentionWrapper.plan`` gets for one head-shared mask."""

    indptr: torch.Tensor
    indices: torch.Tensor
    M: int
    N: int
    block: int
    element_mask: torch.Tensor | None


def element_mask_needed(table: BlockTable, seqlen_k: int, block: int) -> bool:
    """Whether a BSR call needs per-tile element masks: partial tiles, or padded keys touched."""
    padded_keys = seqlen_k % block != 0 and bool((table.kv_block == table.num_k_blocks - 1).any())
    return bool((~table.full).any()) or padded_keys


def tile_element_masks(mask: AttnMask, table: BlockTable, block: int) -> torch.Tensor:
    """(nnz, block, block) bool: each touched tile's attended pairs; padding rows/cols False."""
    rows = np.repeat(np.arange(table.num_q_blocks), np.diff(table.ptr))
    height = torch.from_numpy(np.diff(table.q_bounds)[rows])
    width = torch.from_numpy(np.diff(table.k_bounds)[table.kv_block])
    span = torch.arange(block)
    full = torch.from_numpy(table.full)
    tiles = (
        (span[None, :] < height[:, None])[:, :, None]
        & (span[None, :] < width[:, None])[:, None, :]
        & full[:, None, None]
    )
    partial, dense = table.partial_tile_masks(mask)
    if len(partial):
        tiles[torch.from_numpy(partial), : dense.shape[1], : dense.shape[2]] = dense
    return tiles


def bsr_args(mask: AttnMask, table: BlockTable, block: int, device: torch.device) -> BsrArgs:
    """The BSR of ``table`` (built on a ``block`` grid), padded to whole blocks, on ``device``."""
    needs_mask = element_mask_needed(table, mask.seqlen_k, block)
    return BsrArgs(
        indptr=torch.from_numpy(table.ptr).to(device=device, dtype=torch.int32),
        indices=torch.from_numpy(table.kv_block).to(device=device, dtype=torch.int32),
        M=table.num_q_blocks * block,
        N=table.num_k_blocks * block,
        block=block,
        element_mask=tile_element_masks(mask, table, block).to(device) if needs_mask else None,
    )


def padded_length(length: int, block: int) -> int:
    """``length`` rounded up to whole blocks."""
    return -(-length // block) * block


class _PreparedBsr(PreparedAttention):
    """A planned ``BlockSparseAttentionWrapper``; inputs zero-padded to whole blocks."""

    layout = "shd"

    def __init__(
        self, module: Any, mask: AttnMask, table: BlockTable, problem: Problem, block: int
    ):
        self.block, self.heads, self.seqlen = block, problem.heads_q, problem.seqlen_q
        self.head_dim, self.dtype = problem.head_dim, problem.dtype
        self.device = problem.device
        empty = empty_rows(mask)[0].to(problem.device)  # (Sq,): one mask for all heads
        self.empty = empty if bool(empty.any()) else None
        self.wrapper = None
        if len(table.kv_block) == 0:  # nothing attended: FlashInfer's plan cannot take nnz = 0
            return
        args = bsr_args(mask, table, block, problem.device)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=problem.device)
        self.wrapper = module.BlockSparseAttentionWrapper(workspace, backend="auto")
        self.wrapper.plan(
            indptr=args.indptr,
            indices=args.indices,
            M=args.M,
            N=args.N,
            R=block,
            C=block,
            num_qo_heads=problem.heads_q,
            num_kv_heads=problem.heads_kv,
            head_dim=problem.head_dim,
            mask=args.element_mask,
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

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.wrapper is None:
            out = q.new_zeros(self.seqlen, self.heads, q.shape[-1])
            lse = torch.full((self.heads, self.seqlen), float("-inf"), device=q.device)
            return out, lse.to(lse_dtype(q.dtype))
        out, lse = self.wrapper.run(q, k, v, return_lse=True)
        return to_lcab_convention(
            out[: self.seqlen],
            lse[: self.seqlen] * LN2,  # (M, Hq) log2 → natural log
            "th",
            heads=self.heads,
            seqlen=self.seqlen,
            empty=self.empty,
            dtype=q.dtype,
            library="FlashInfer BlockSparseAttentionWrapper",
            follows="flashinfer-python 0.7 (lse (M, num_qo_heads), log2)",
        )


# ----------------------------------------------------------------------------- per KV head
def head_edges(mask: AttnMask, head: int) -> tuple[IntArray, IntArray]:
    """Query and key block offsets of one head: 0, the length, and every slice edge."""
    s = mask.head_slices(head)
    q = np.unique(np.concatenate([[0, mask.seqlen_q], s[:, 0], s[:, 1]]))
    k = np.unique(np.concatenate([[0, mask.seqlen_k], s[:, 2], s[:, 3]]))
    return q.astype(np.int64), k.astype(np.int64)


def per_head_partition_reason(mask: AttnMask) -> str | None:
    """None when every head's touched tiles are full on its edge partition, else why not.

    A rectangular (fully attended) slice is a union of whole tiles of a grid containing its
    edges, so only heads with other slices need their block table.
    """
    s = mask.slices
    rectangular = slice_areas(s) == (s[:, 1] - s[:, 0]) * (s[:, 3] - s[:, 2])
    heads = np.repeat(np.arange(mask.num_heads), np.diff(mask.head_ptr))
    for head in np.unique(heads[~rectangular]):
        table = block_table(mask.head(int(head)), *head_edges(mask, int(head)))
        partial = int((~table.full).sum())
        if partial:
            return (
                f"head {head} has {partial} partly attended tiles on its slice-edge partition; "
                "VariableBlockSparseAttentionWrapper has no element mask, so per-KV-head masks "
                "must be unions of whole rectangles (block_sparse, varblock_sparse)"
            )
    return None


def refine(edges: IntArray, count: int) -> tuple[IntArray, IntArray]:
    """Split the largest blocks of ``edges`` until there are ``count``: (new edges, owner block).

    Each block is split evenly into its share of pieces, so no block is empty and the sizes stay
    as uniform as the partition allows.
    """
    sizes = np.diff(edges)
    pieces = np.ones(len(sizes), dtype=np.int64)
    heap = [(-float(size), int(i)) for i, size in enumerate(sizes)]
    heapq.heapify(heap)
    for _ in range(count - len(sizes)):
        _, i = heapq.heappop(heap)
        pieces[i] += 1
        if pieces[i] < sizes[i]:
            heapq.heappush(heap, (-sizes[i] / pieces[i], i))
    owner = np.repeat(np.arange(len(sizes)), pieces)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    step = np.arange(len(owner)) - first  # piece index within its block
    starts = edges[owner] + (sizes[owner] * step) // pieces[owner]
    return np.append(starts, edges[-1]).astype(np.int64), owner


@dataclass(frozen=True)
class VariableArgs:
    """What ``VariableBlockSparseAttentionWrapper.plan`` gets: (Hkv, MB, NB) map and sizes."""

    block_mask_map: torch.Tensor
    block_row_sz: torch.Tensor
    block_col_sz: torch.Tensor


def variable_args(mask: AttnMask, device: torch.device) -> VariableArgs:
    """Per-head partitions (slice edges, refined to common counts) and their touched blocks."""
    edges = [head_edges(mask, h) for h in range(mask.num_heads)]
    rows = max(len(q) - 1 for q, _ in edges)
    cols = max(len(k) - 1 for _, k in edges)
    maps, row_sz, col_sz = [], [], []
    for head, (q_edges, k_edges) in enumerate(edges):
        q_fine, q_owner = refine(q_edges, rows)
        k_fine, k_owner = refine(k_edges, cols)
        touched = block_table(mask.head(head), q_edges, k_edges).dense_blocks()[0] > 0
        maps.append(touched[torch.from_numpy(q_owner)][:, torch.from_numpy(k_owner)])
        row_sz.append(torch.from_numpy(np.diff(q_fine)))
        col_sz.append(torch.from_numpy(np.diff(k_fine)))
    return VariableArgs(
        block_mask_map=torch.stack(maps).to(device),
        block_row_sz=torch.stack(row_sz).to(device=device, dtype=torch.int32),
        block_col_sz=torch.stack(col_sz).to(device=device, dtype=torch.int32),
    )


class _PreparedVariable(PreparedAttention):
    """A planned ``VariableBlockSparseAttentionWrapper``: (H, S, D) tensors."""

    def __init__(self, module: Any, mask: AttnMask, problem: Problem) -> None:
        self.heads, self.seqlen = problem.heads_q, problem.seqlen_q
        empty = empty_rows(mask).repeat_interleave(problem.gqa_group, 0).to(problem.device)
        self.empty = empty if bool(empty.any()) else None  # (Hq, Sq)
        self.wrapper = None
        if mask.num_slices == 0:  # nothing attended: plan cannot expand zero selected blocks
            return
        args = variable_args(mask, problem.device)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=problem.device)
        self.wrapper = module.VariableBlockSparseAttentionWrapper(workspace, backend="auto")
        self.wrapper.plan(
            block_mask_map=args.block_mask_map,
            block_row_sz=args.block_row_sz,
            block_col_sz=args.block_col_sz,
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

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.wrapper is None:
            lse = torch.full((self.heads, self.seqlen), float("-inf"), device=q.device)
            return torch.zeros_like(q), lse.to(lse_dtype(q.dtype))
        out, lse = self.wrapper.run(q, k, v, return_lse=True)
        lse = lse_to_lcab(
            lse * LN2,  # (Hq, S) log2 → natural log
            "ht",
            self.heads,
            self.seqlen,
            "FlashInfer VariableBlockSparseAttentionWrapper",
            "flashinfer-python 0.7 (lse (num_qo_heads, qo_len), log2)",
        ).to(lse_dtype(q.dtype))
        if self.empty is not None:
            out = out.masked_fill(self.empty[:, :, None], 0.0)
            lse = lse.masked_fill(self.empty, float("-inf"))
        return out, lse


# ----------------------------------------------------------------------------- kernel
@register_kernel
class FlashInferSparseKernel(Kernel):
    """FlashInfer block-sparse attention (BSR + element masks, or per-head variable blocks)."""

    name = "sparse_flashinfer"
    summary = (
        "FlashInfer block-sparse wrappers (BSR + element masks; per-head variable blocks), fwd"
    )
    options_cls = FlashInferOptions
    caps = KernelCaps(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        lowering="block_table",
        backward_devices=frozenset(),
        head_dims=frozenset({64, 128, 256}),
        gqa=True,
        per_head_masks=True,
        returns_lse=True,
        package="flashinfer",
        pip_name="flashinfer-python",
        min_compute_capability=(8, 0),
        contract_tested=True,  # tests/unit/test_adapter_flashinfer.py; not GPU-verified
    )
    probe: ClassVar[PackageProbe] = PackageProbe(
        module="flashinfer",
        distributions=("flashinfer-python", "flashinfer"),
        needs=(
            ApiNeed("BlockSparseAttentionWrapper", ("backend",), positional=1),
            ApiNeed("BlockSparseAttentionWrapper.plan", BSR_PLAN_KWARGS, positional=1),
            ApiNeed("BlockSparseAttentionWrapper.run", ("return_lse",), positional=4),
            ApiNeed("VariableBlockSparseAttentionWrapper", ("backend",), positional=1),
            ApiNeed("VariableBlockSparseAttentionWrapper.plan", VARIABLE_PLAN_KWARGS, positional=1),
            ApiNeed("VariableBlockSparseAttentionWrapper.run", ("return_lse",), positional=4),
        ),
        min_version="0.2.7",
        requirement=">= 0.2.7 (VariableBlockSparseAttentionWrapper)",
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
        if mask is None or (mask.num_heads > 1 and mask.num_heads != problem.heads_kv):
            return reasons
        why = self.mask_reason(mask)
        if why is not None:
            reasons.append(why)
        return reasons

    def mask_reason(self, mask: AttnMask) -> str | None:
        """Why this mask cannot be planned (partial per-head tiles, element mask too big)."""
        if mask.num_heads > 1:
            why = per_head_partition_reason(mask)
            return None if why is None else f"per-KV-head mask not expressible: {why}"
        if self.block_size < 1:
            return f"block_size={self.block_size} must be >= 1"
        table = self.shared_table(mask)
        elements = len(table.kv_block) * self.block_size**2
        if elements > ELEMENT_MASK_LIMIT and element_mask_needed(
            table, mask.seqlen_k, self.block_size
        ):
            return (
                f"FlashInfer's element mask for the {len(table.kv_block)} touched "
                f"{self.block_size}x{self.block_size} tiles would hold {elements} booleans "
                f"(lcab's limit {ELEMENT_MASK_LIMIT}): partly attended tiles (or keys padded to "
                "whole blocks) need a mask for every tile"
            )
        return None

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        return probe_reasons(self.probe, problem.device)

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.probe.module)  # lazily: CUDA-only package
        if mask.num_heads > 1:
            return _PreparedVariable(module, mask, problem)
        return _PreparedBsr(module, mask, self.shared_table(mask), problem, self.block_size)
