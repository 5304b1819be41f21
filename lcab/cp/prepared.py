"""`CPPrepared`: a strategy bound to one mask on this rank, seen by the runner as one kernel.

``to_native`` shards a global tensor by this rank's layout (padding slots are zero), ``run`` is
the distributed attention (timed), ``from_native`` / ``lse_from_native`` gather every rank's
shard back into global order (collectives: every rank calls them). ``collect`` brings
chosen global rows to rank 0 alone, one rank's part at a time, so checking outputs at
context-parallel lengths never puts a global tensor on any rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from lcab.cp.comm import all_gather_flat, broadcast_from
from lcab.cp.plan import Plan
from lcab.kernels import PreparedAttention
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

RunFn: TypeAlias = (
    "Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]"
)


class CPPrepared(PreparedAttention):
    """One rank's part of a distributed attention call."""

    layout = "shd"

    def __init__(self, plan: Plan, rank: int, run: RunFn, mask: AttnMask) -> None:
        self.plan, self.rank, self._run, self.mask = plan, rank, run, mask
        self.seqlen = mask.seqlen_q
        layout = torch.from_numpy(plan.rank_layouts[rank])
        self._real = layout >= 0
        self._index = layout[self._real]
        all_layouts = torch.from_numpy(np.concatenate(plan.rank_layouts))
        self._all_real = all_layouts >= 0
        self._all_index = all_layouts[self._all_real]
        self.tokens = layout
        """Global token of each local slot (-1: padding)."""
        self.is_root = rank == 0
        """Whether this rank checks numerics (`lcab.bench.numerics.Collector`)."""

    def to_native(self, x: torch.Tensor) -> torch.Tensor:
        """The shard of a global (S, H, D) tensor this rank holds."""
        local = x.new_zeros((len(self._real), *x.shape[1:]))
        local[self._real] = x[self._index.to(x.device)]
        return local

    def from_native(self, x: torch.Tensor) -> torch.Tensor:
        """The global (S, H, D) tensor from every rank's shard (collective)."""
        gathered = torch.empty(
            (self.plan.world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device
        )
        all_gather_flat(gathered, x.detach().contiguous())  # unsharding: not counted as CP comm
        out = x.new_zeros((self.seqlen, *x.shape[1:]))
        out[self._all_index.to(x.device)] = gathered[self._all_real.to(x.device)]
        return out

    def collect(self, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor | None:
        """Global rows ``rows`` (sorted; None: all) of a sharded (n, ...) tensor, on rank 0.

        Collective: each rank in turn broadcasts its wanted rows (sizes come from the plan, so
        only rows travel), and no rank holds more than one part at a time besides rank 0's
        result. Other ranks return None.
        """
        wanted = np.arange(self.seqlen) if rows is None else rows.to("cpu", torch.long).numpy()
        out = None
        if self.rank == 0:
            out = x.new_zeros((len(wanted), *x.shape[1:]))
        for source, layout in enumerate(self.plan.rank_layouts):
            slots = np.flatnonzero(np.isin(layout, wanted))
            if not len(slots):
                continue
            if source == self.rank:
                part = x.detach()[torch.from_numpy(slots).to(x.device)].contiguous()
            else:
                part = x.new_empty((len(slots), *x.shape[1:]))
            broadcast_from(part, source)
            if out is not None:
                dest = np.searchsorted(wanted, layout[slots])
                out[torch.from_numpy(dest).to(x.device)] = part
        return out

    def collect_lse(self, lse: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor | None:
        """Columns ``rows`` of the global (H, S) LSE from every rank's (H, n) shard, on rank 0."""
        got = self.collect(lse.t().contiguous(), rows)
        return None if got is None else got.t()

    def lse_from_native(self, lse: torch.Tensor) -> torch.Tensor:
        """The global (H, S) LSE from every rank's (H, n) shard (collective)."""
        return self.from_native(lse.t().contiguous()).t()

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The distributed attention of local shards (collective; timed)."""
        return self._run(q, k, v)


# A kernel call's own autograd graph inside a custom Function (Ulysses, Ring All-Gather wrap the
# call to time its backward or run collectives around it): the call runs on detached leaves, and
# the Function's backward differentiates it with `torch.autograd.grad` and ``retain_graph``, as
# benchmarks repeat the backward of one forward and nothing may accumulate in ``.grad``.


def detached_leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh leaves sharing the tensors' storage, requiring grad (roots of the inner graph)."""
    return [t.detach().requires_grad_(True) for t in tensors]


def leaf_grads(
    out: torch.Tensor, leaves: list[torch.Tensor], dout: torch.Tensor
) -> list[torch.Tensor]:
    """d(out)/d(leaf) · dout for every leaf; zeros for leaves ``out`` does not depend on."""
    found = torch.autograd.grad(out, leaves, dout, retain_graph=True, allow_unused=True)
    return [g if g is not None else torch.zeros_like(t) for g, t in zip(found, leaves, strict=True)]
