"""One call's tensors in the tiled engine's packed layout, and reads/writes by batch.

Row ``s·Hkv + h`` holds KV head h's G query heads of token s: the memory layout of q and out
themselves, so nothing is repacked. Per-batch temporaries live in the thread's scratch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lcab.kernels.tiled.plan import Batch, TiledPlan
from lcab.kernels.tiled.workers import scratch
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def gather_rows(slot: str, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] (rows) into this thread's scratch ``slot``."""
    out = scratch(slot, index.numel() * x.shape[1], x.dtype, x.device)
    return torch.index_select(x, 0, index, out=out.view(index.numel(), x.shape[1]))


def _same_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two views of one shape are the same elements (strides of size-1 dims aside).

    A later wave merges into the accumulator's rows in place, and torch refuses to copy a view
    onto a differently strided view of itself.
    """
    if a.data_ptr() != b.data_ptr():
        return False
    return all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape, strict=True) if n > 1)


@dataclass
class Buffers:
    """One call's tensors in the packed layout: row ``s·Hkv + h`` holds KV head h's G heads.

    Accumulators (out, lse, dq, dout) carry one extra "trash" row that padded rows write to.
    """

    plan: TiledPlan
    scale: float
    dtype: torch.dtype
    acc: torch.dtype
    q: torch.Tensor
    """(Hkv·Sq, G·D) view of q."""
    k: torch.Tensor
    """(Hkv·Sk, D) view of k."""
    v: torch.Tensor
    lse: torch.Tensor | None = None
    """(Hkv·Sq + 1, G) accumulated lse."""

    @classmethod
    def of(cls, plan: TiledPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Buffers:
        """Packed views of one call's q, k, v (no copy) with accumulators still unset."""
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        d = q.shape[-1]
        return cls(
            plan,
            1.0 / math.sqrt(d),
            q.dtype,
            acc,
            q.contiguous().view(-1, plan.group * d),
            k.contiguous().view(-1, d),
            v.contiguous().view(-1, d),
        )

    def _rows(self, batch: Batch, x: torch.Tensor) -> torch.Tensor:
        """A view batch's rows of packed x as (heads, rows, width) (strided)."""
        p = self.plan
        assert batch.view is not None
        head, q0, q1, _, _ = batch.view
        full = x[: p.heads_kv * p.seqlen_q].view(p.seqlen_q, p.heads_kv, -1)
        rows = full[q0:q1].transpose(0, 1)
        return rows if head < 0 else rows[head : head + 1]

    def _keys(self, batch: Batch, x: torch.Tensor) -> torch.Tensor:
        """A view batch's keys of packed x as (heads, keys, width) (strided, no copy)."""
        p = self.plan
        assert batch.view is not None
        head, _, _, k0, k1 = batch.view
        keys = x.view(p.seqlen_k, p.heads_kv, -1)[k0:k1].transpose(0, 1)
        return keys if head < 0 else keys[head : head + 1]

    def fetch_q(self, batch: Batch) -> torch.Tensor:
        """Scaled q of the batch as (N, rows·G, D), in this thread's scratch."""
        d = self.k.shape[1]
        if batch.view is not None:
            rows = self._rows(batch, self.q)
            out = scratch("q", rows.numel(), self.dtype, self.q.device).view(rows.shape)
            torch.mul(rows, self.scale, out=out)
        else:
            assert batch.row_read is not None
            out = gather_rows("q", self.q, batch.row_read).mul_(self.scale)
        return out.view(-1, batch.rows * self.plan.group, d)

    def fetch_kv(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The k and v of the batch as (N, keys, D)."""
        if batch.view is not None:
            return self._keys(batch, self.k), self._keys(batch, self.v)
        assert batch.key_index is not None
        d = self.k.shape[1]
        kb = gather_rows("k", self.k, batch.key_index).view(-1, batch.keys, d)
        vb = gather_rows("v", self.v, batch.key_index).view(-1, batch.keys, d)
        return kb, vb

    def get_rows(self, batch: Batch, x: torch.Tensor) -> torch.Tensor:
        """Rows of an accumulator (with trash row) as (N, rows·G, width / G)."""
        width = x.shape[1] // self.plan.group
        if batch.view is not None:
            rows = self._rows(batch, x)
        else:
            assert batch.row_write is not None
            rows = x.index_select(0, batch.row_write)  # small (rows x G·D), or rare merges
        return rows.reshape(-1, batch.rows * self.plan.group, width)

    def put_rows(self, batch: Batch, x: torch.Tensor, values: torch.Tensor) -> None:
        """x[rows of batch] = values (N, rows·G, width / G)."""
        if batch.view is not None:
            rows = self._rows(batch, x)
            values = values.view(rows.shape)
            if not _same_elements(rows, values):  # a merge in place has written them already
                rows.copy_(values)
        else:
            assert batch.row_write is not None
            x.index_copy_(0, batch.row_write, values.reshape(-1, x.shape[1]))

    def add_rows(self, batch: Batch, x: torch.Tensor, values: torch.Tensor) -> None:
        """x[rows of batch] += values (N, rows·G, width / G)."""
        values = values.to(x.dtype)
        if batch.view is not None:
            rows = self._rows(batch, x)
            rows.add_(values.view(rows.shape))
        else:
            assert batch.row_write is not None
            x.index_add_(0, batch.row_write, values.reshape(-1, x.shape[1]))

    def add_keys(self, batch: Batch, x: torch.Tensor, values: torch.Tensor) -> None:
        """x[keys of batch] += values (N, keys, D)."""
        values = values.to(x.dtype)
        if batch.view is not None:
            keys = self._keys(batch, x)
            keys.add_(values.view(keys.shape))
        else:
            assert batch.key_index is not None
            x.index_add_(0, batch.key_index, values.reshape(-1, x.shape[1]))


def accumulator(
    plan: TiledPlan, width: int, dtype: torch.dtype, device: torch.device, fill: float
) -> torch.Tensor:
    """(Hkv·Sq + 1, width) buffer; only untouched rows and the trash row are set to ``fill``."""
    rows = plan.heads_kv * plan.seqlen_q
    buf = torch.empty(rows + 1, width, dtype=dtype, device=device)
    buf[rows:].fill_(fill)
    if plan.untouched.numel():
        buf.index_fill_(0, plan.untouched, fill)
    return buf


def zeros_with_trash(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(rows + 1, width) copy of (rows, width) x in ``dtype`` with a zero last row."""
    out = torch.empty(x.shape[0] + 1, x.shape[1], dtype=dtype, device=x.device)
    out[:-1].copy_(x)
    out[-1].zero_()
    return out


def lse_out(plan: TiledPlan, lse: torch.Tensor) -> torch.Tensor:
    """(Hkv·Sq + 1, G) packed lse → (Hq, Sq)."""
    rows = plan.heads_kv * plan.seqlen_q
    return lse[:rows].view(plan.seqlen_q, plan.heads_q).t().contiguous()


def rows_out(plan: TiledPlan, x: torch.Tensor) -> torch.Tensor:
    """(Hkv·Sq + 1, G·D) packed rows → (Sq, Hq, D) on the same memory (``set_``: modifiable)."""
    d = x.shape[1] // plan.group
    shape, stride = (plan.seqlen_q, plan.heads_q, d), (plan.heads_q * d, d, 1)
    return x.new_empty(0).set_(x.untyped_storage(), int(x.storage_offset()), shape, stride)
