"""VSA (Video Sparse Attention) kernels of ``fastvideo-kernel``: ThunderKittens and Triton.

CPU contract-tested only; op signatures and LSE facts are the rows of `lcab.kernels.upstream.vsa`.
The public entry picks its backend from the environment, so lcab calls the two ops directly:
``sparse_vsa`` (``block_sparse_attn_sm90``, sm_90a, head dim 64/128, needs ``fastvideo_kernel._C``)
and ``sparse_vsa_triton``. Whole 64x64 tiles (`partial_tile_reason`), Hq == Hkv, non-causal, S
padded to a multiple of 64. The TK forward reads out of bounds when a query block selects
nothing, so such blocks get block 0 (their rows are empty in the mask and set from it). The LSE
is not differentiable: no backward from merged statistics.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from typing_extensions import override

from lcab.kernels.base import (
    Kernel,
    KernelCaps,
    Output,
    PreparedAttention,
    Problem,
    cuda_adapter_caps,
    empty_rows,
    lse_dtype,
)
from lcab.kernels.block_grid import partial_tile_reason
from lcab.kernels.packages import ApiNeed, PackageProbe, cuda_present
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream import vsa as upstream
from lcab.kernels.upstream.facts import UpstreamFunction
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask
from lcab.masks.lowering.blocks import BlockTable, block_table, uniform_bounds

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import Tensor
else:
    torch = lazy_module("torch", globals())
    F = lazy_module("torch.nn.functional", globals(), "F")

#: VSA's tile: 64 queries x 64 keys (a 4x4x4 video cube).
VSA_BLOCK = 64
#: The module whose autograd ops lcab calls.
VSA_MODULE = upstream.MODULE


def vsa_indices(
    table: BlockTable, heads: int, *, fill_empty: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q2k_idx (1, H, nQb, max_kv), q2k_num (1, H, nQb)) int32 of a 64x64 block table.

    With ``fill_empty``, query blocks selecting nothing list block 0 (TK needs q2k_num >= 1).
    """
    counts = np.diff(table.ptr)
    n_rows = len(counts)
    row = np.repeat(np.arange(n_rows), counts)
    slot = np.arange(len(table.kv_block), dtype=np.int64) - np.repeat(table.ptr[:-1], counts)
    idx = np.zeros((n_rows, max(int(counts.max(initial=0)), 1)), dtype=np.int32)
    idx[row, slot] = table.kv_block
    num = counts.astype(np.int32)
    if fill_empty:
        num = np.maximum(num, 1)  # idx is 0 in those rows
    shape = (table.num_heads, table.num_q_blocks)
    q2k_idx = torch.from_numpy(idx.reshape(*shape, -1))
    q2k_num = torch.from_numpy(num.reshape(shape))
    if table.num_heads != heads:
        q2k_idx = q2k_idx.expand(heads, -1, -1)
        q2k_num = q2k_num.expand(heads, -1)
    return q2k_idx.unsqueeze(0).contiguous(), q2k_num.unsqueeze(0).contiguous()


def variable_block_sizes(seqlen_k: int) -> torch.Tensor:
    """Valid keys of each 64-key block: 64, ..., 64, and the remainder for the last block."""
    return torch.from_numpy(np.diff(uniform_bounds(seqlen_k, VSA_BLOCK)).astype(np.int32))


def natural_lse_scale(row: UpstreamFunction, head_dim: int) -> float:
    """What the op's LSE is multiplied by to be natural log (`lcab.kernels.upstream.vsa`)."""
    if row is upstream.BLOCK_SPARSE_ATTN_SM90:
        return 1.0 / upstream.tk_lse_factor(head_dim)
    if row.lse is None:
        raise ValueError(f"{row.qualname}: lcab's table states no LSE")
    return math.log(2.0) if row.lse.base == "2" else 1.0


class _PreparedVSA(PreparedAttention):
    """One VSA op bound to the mask's indices; pads to 64, converts the LSE, sets empty rows."""

    layout = "bhsd"

    def __init__(
        self, mask: AttnMask, problem: Problem, op: Callable[..., Any], thunderkittens: bool
    ) -> None:
        table = block_table(mask, VSA_BLOCK, VSA_BLOCK)
        q2k_idx, q2k_num = vsa_indices(table, problem.heads_q, fill_empty=thunderkittens)
        device = problem.device
        sizes = variable_block_sizes(problem.seqlen_k)
        self.args = tuple(t.to(device) for t in (q2k_idx, q2k_num, sizes))
        self.op = op
        self.seqlen_q = problem.seqlen_q
        self.pad_q = -problem.seqlen_q % VSA_BLOCK
        self.pad_k = -problem.seqlen_k % VSA_BLOCK
        row = (
            upstream.BLOCK_SPARSE_ATTN_SM90 if thunderkittens else upstream.BLOCK_SPARSE_ATTN_TRITON
        )
        self.lse_scale = natural_lse_scale(row, problem.head_dim)  # natural log = native * this
        self.thunderkittens = thunderkittens
        empty = empty_rows(mask).to(device)  # (H_mask, Sq); H_mask is 1 or Hq (= Hkv)
        self.has_empty = bool(empty.any())
        self.empty_lse = empty if empty.shape[0] > 1 else empty[0]  # broadcasts over (Hq, Sq)
        self.empty_out = self.empty_lse.unsqueeze(-1).unsqueeze(0)  # over (1, Hq, Sq, D)

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Output:
        if self.pad_q:
            q = F.pad(q, (0, 0, 0, self.pad_q))
        if self.pad_k:  # padded keys are masked by variable_block_sizes
            k, v = F.pad(k, (0, 0, 0, self.pad_k)), F.pad(v, (0, 0, 0, self.pad_k))
        out, lse = self.op(q, k, v, *self.args)
        expected = (1, q.shape[1], q.shape[2], 1) if self.thunderkittens else q.shape[:3]
        if tuple(lse.shape) != tuple(expected):
            raise RuntimeError(
                f"VSA returned an LSE of shape {tuple(lse.shape)}; lcab's adapter follows "
                f"fastvideo-kernel 0.3.x, whose {'TK' if self.thunderkittens else 'Triton'} "
                f"op returns {tuple(expected)}"
            )
        out = out[:, :, : self.seqlen_q]
        lse = lse.detach().reshape(lse.shape[1], -1)[:, : self.seqlen_q]
        lse = lse.to(lse_dtype(q.dtype)) * self.lse_scale
        if self.has_empty:  # TK computes those rows from a stand-in block; Triton gives 0/-inf
            out = out.masked_fill(self.empty_out, 0.0)
            lse = lse.masked_fill(self.empty_lse, float("-inf"))
        return out, lse


def _vsa_caps(min_cc: tuple[int, int], op: UpstreamFunction) -> KernelCaps:
    package = PackageProbe(
        module=op.module,
        package="fastvideo_kernel",
        distributions=(upstream.DISTRIBUTION, "fastvideo_kernel"),
        install='pip install --no-deps "fastvideo-kernel==0.3.4"',
        note="0.3.5 pins torch==2.12.0",
        needs=(ApiNeed(op.name, (), positional=len(op.params)),),
        min_version="0.3.0",
        requirement=">= 0.3.0, whose block-sparse ops take q2k_idx/q2k_num",
    )
    return cuda_adapter_caps(
        "block_table",
        dtypes=frozenset({"bfloat16"}),
        head_dims=frozenset({64, 128}),
        gqa=False,
        per_head_masks=True,
        requires=package,
        min_compute_capability=min_cc,
    )


class _VSAKernel(Kernel):
    """Shared by both backends: 64x64 full tiles, padding, LSE conversion, empty rows."""

    op_name: ClassVar[str]
    thunderkittens: ClassVar[bool]

    @override
    def mask_reasons(self, mask: AttnMask) -> list[str]:
        why = partial_tile_reason(mask, VSA_BLOCK, VSA_BLOCK)
        return super().mask_reasons(mask) + ([why] if why else [])

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(VSA_MODULE)  # lazily: CUDA-only package
        return _PreparedVSA(mask, problem, getattr(module, self.op_name), self.thunderkittens)


def thunderkittens_reasons() -> list[str]:
    """Why the TK extension is unusable (the package falls back to Triton silently)."""
    try:
        module = importlib.import_module(VSA_MODULE)
        forward, backward = module._get_sm90_ops()
    except Exception as err:  # an import failure is already a probe reason; be safe
        return [f"{VSA_MODULE} cannot report its ThunderKittens ops: {type(err).__name__}: {err}"]
    if forward is None or backward is None:
        return [
            "fastvideo_kernel's ThunderKittens extension (fastvideo_kernel._C block_sparse_fwd/"
            "bwd) did not load (a wheel built for another torch, or built without TK); build "
            "the sdist for this torch with TORCH_CUDA_ARCH_LIST=9.0a"
        ]
    return []


@register_kernel
class VSAThunderKittensKernel(_VSAKernel):
    """VSA's ThunderKittens kernel (sm_90a), 64x64 full tiles (CPU contract-tested)."""

    name = "sparse_vsa"
    summary = "VSA block-sparse 64x64 (fastvideo-kernel, ThunderKittens sm90a)"
    colour = "#9c9ede"
    caps = _vsa_caps((9, 0), upstream.BLOCK_SPARSE_ATTN_SM90)
    op_name = upstream.BLOCK_SPARSE_ATTN_SM90.name
    thunderkittens = True

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        if problem.device_type != "cuda" or not cuda_present():
            return []
        if self.package_reasons(problem.device):  # reported once, by the base class
            return []
        major, minor = torch.cuda.get_device_capability(problem.device)
        if (major, minor) != (9, 0):
            return [
                f"VSA's ThunderKittens kernel is built for sm_90a only (this GPU is "
                f"sm_{major}{minor}); sparse_vsa_triton runs elsewhere"
            ]
        return thunderkittens_reasons()


@register_kernel
class VSATritonKernel(_VSAKernel):
    """VSA's Triton kernel, 64x64 full tiles (CPU contract-tested)."""

    name = "sparse_vsa_triton"
    summary = "VSA block-sparse 64x64 (fastvideo-kernel, Triton)"
    colour = "#cedb9c"
    caps = _vsa_caps((8, 0), upstream.BLOCK_SPARSE_ATTN_TRITON)
    op_name = upstream.BLOCK_SPARSE_ATTN_TRITON.name
    thunderkittens = False
