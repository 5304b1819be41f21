"""All communication of context parallelism goes through here, and is counted.

Every call records, per operation name, the calls and the bytes this rank *sends* (logical
volume: an all-to-all the (g-1)/g of its input, an all-gather or reduce-scatter (g-1) chunks, as
ring algorithms do); tests hold them equal to each strategy's analytic `comm_volume`.

Time inside the calls is recorded too: ``comm`` (blocking collectives, waiting for slower peers
included) and ``wait`` (blocking on a P2P transfer posted before compute), on the GPU's clock
under CUDA (`lcab.cp.phase_clock`). Only collectives gloo and NCCL both implement are used, so
the same code runs on CPU and GPU; gloo's CUDA P2P goes through host copies
(`lcab.distributed.staging`). On a group of the schedule check (`lcab.cp.schedule`) every call is
written into the rank's log instead, with buffers of the right shapes handed back.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lcab.cp.phase_clock import phase_clock as phase_clock  # re-exported for the runner
from lcab.cp.phase_clock import timed_phase
from lcab.cp.phase_clock import traced_phases as traced_phases  # re-exported
from lcab.cp.schedule import RankSchedule, RecordedGroup
from lcab.distributed import staging
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
else:
    torch = lazy_module("torch", globals())
    dist = lazy_module("torch.distributed", globals(), "dist")


@dataclass
class CommStats:
    """Counters of one rank: calls and bytes sent per operation, seconds per phase."""

    calls: Counter[str] = field(default_factory=Counter)
    bytes_sent: Counter[str] = field(default_factory=Counter)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def reset(self) -> None:
        """Zero every counter."""
        self.calls.clear()
        self.bytes_sent.clear()
        self.seconds.clear()


STATS = CommStats()
"""This process's counters (one rank per process)."""


_BACKWARD_OPS = ("_grad", "_bwd", "dkv")


def is_backward_op(name: str) -> bool:
    """Whether a counted operation belongs to the backward pass (by its naming convention)."""
    return any(tag in name for tag in _BACKWARD_OPS)


def nbytes(t: torch.Tensor) -> int:
    """Payload bytes of a tensor."""
    return t.numel() * t.element_size()


def phase(name: str) -> timed_phase:
    """Add the block's duration to ``STATS.seconds[name]``, on the phase clock (`phase_clock`)."""
    return timed_phase(name, STATS.seconds)


def _count(op: str, sent: int) -> None:
    STATS.calls[op] += 1
    STATS.bytes_sent[op] += sent


# ---------------------------------------------------------------------------- point to point
class PendingExchange:
    """Receives posted with `exchange`; `wait` returns the received tensors.

    Staged (``like`` given): the transfers land in host buffers, copied to ``like``'s device
    when waited for; the host copies of the sent tensors stay referenced until then.
    """

    def __init__(
        self,
        works: list[Any],
        received: list[torch.Tensor],
        like: torch.Tensor | None = None,
        keep: list[torch.Tensor] | None = None,
    ) -> None:
        self.works, self.received = works, received
        self._like, self._keep = like, keep

    def wait(self) -> list[torch.Tensor]:
        """Block until every posted transfer finished (time counted as ``wait``)."""
        with phase("wait"):
            for work in self.works:
                work.wait()
            if self._like is not None:
                self.received = [staging.to_device(h, self._like) for h in self.received]
                self._like, self._keep = None, None
        return self.received


def exchange(
    send: list[torch.Tensor], dst: int, src: int, group: Any, op: str = "p2p"
) -> PendingExchange:
    """Post sends of ``send`` to ``dst`` and receives of the same shapes from ``src``; no wait."""
    if isinstance(group, RecordedGroup):  # the schedule check: nothing is sent or counted
        return _Recorded(group.log, op, group.log.post(op, group, dst, src, send), send)
    send = [t.contiguous() for t in send]
    if staging.stages_p2p() and send:
        return _exchange_staged(send, dst, src, group, op)
    # contiguous buffers: empty_like would copy a non-contiguous tensor's strides, and the
    # transport writes raw memory
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in send]
    ops = [dist.P2POp(dist.isend, t, dst, group) for t in send]
    ops += [dist.P2POp(dist.irecv, t, src, group) for t in received]
    with phase("comm"):
        works = dist.batch_isend_irecv(ops)
    _count(op, sum(nbytes(t) for t in send))
    return PendingExchange(works, received)


class _Recorded(PendingExchange):
    """An exchange of the schedule check: waiting is an event.

    What it "receives" is what was sent (the shapes a peer sends): no buffer is made, so a
    runner must not write in place into a received tensor that autograd saved (none does).
    """

    def __init__(self, log: RankSchedule, op: str, handle: int, send: list[torch.Tensor]) -> None:
        super().__init__([], list(send))
        self.log, self.op, self.handle = log, op, handle

    def wait(self) -> list[torch.Tensor]:
        """Record the wait."""
        self.log.wait(self.op, self.handle)
        return self.received


def _exchange_staged(
    send: list[torch.Tensor], dst: int, src: int, group: Any, op: str
) -> PendingExchange:
    """`exchange` through host buffers: gloo's send/recv read and write host memory only."""
    with phase("comm"):
        host_send = [staging.to_host(t) for t in send]
        host_recv = [staging.host_like(t) for t in send]
        ops = [dist.P2POp(dist.isend, t, dst, group) for t in host_send]
        ops += [dist.P2POp(dist.irecv, t, src, group) for t in host_recv]
        works = dist.batch_isend_irecv(ops)
    _count(op, sum(nbytes(t) for t in send))
    return PendingExchange(works, host_recv, like=send[0], keep=host_send)


# ---------------------------------------------------------------------------- collectives
def _group_size(group: Any) -> int:
    if isinstance(group, RecordedGroup):
        return len(group.ranks)
    return int(dist.get_world_size(group))


def _recorded(group: Any, kind: str, op: str, x: torch.Tensor, sent: int) -> bool:
    """Whether ``group`` is the schedule check's: then the collective is recorded, not run."""
    if isinstance(group, RecordedGroup):
        group.log.issue(kind, op, group, [x], sent)
    return isinstance(group, RecordedGroup)


def all_to_all_raw(x: torch.Tensor, group: Any, op: str) -> torch.Tensor:
    """all_to_all_single over dim 0 (equal splits), counted."""
    size = _group_size(group)
    x = x.contiguous()
    sent = nbytes(x) * (size - 1) // size
    with phase("comm"):
        if _recorded(group, "a2a", op, x, sent):
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        elif staging.stages_collectives():
            host = staging.host_like(x)
            dist.all_to_all_single(host, staging.to_host(x), group=group)
            out = staging.to_device(host, x)
        else:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
            dist.all_to_all_single(out, x, group=group)
    _count(op, sent)
    return out


@functools.cache
def _all_to_all_function() -> type[torch.autograd.Function]:
    """The autograd Function of `all_to_all`, made on first use (it needs torch: `lcab.lazy`)."""

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, group: Any, op: str) -> torch.Tensor:
            ctx.group, ctx.op = group, op
            return all_to_all_raw(x, group, op)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
            return all_to_all_raw(grad, ctx.group, ctx.op + "_grad"), None, None

    return AllToAll


def all_to_all(x: torch.Tensor, group: Any, op: str = "all_to_all") -> torch.Tensor:
    """Differentiable all-to-all over dim 0: chunk i of ``x`` goes to the i-th rank of ``group``."""
    return _all_to_all_function().apply(x, group, op)


def _flat_all_gather() -> Callable[..., Any]:
    """The flat all-gather: torch >= 2.10 renamed it (the old name warns); older has only that."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _flat_reduce_scatter() -> Callable[..., Any]:
    """The flat reduce-scatter, under its name in this release (see `_flat_all_gather`)."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_flat(out: torch.Tensor, x: torch.Tensor, group: Any = None) -> None:
    """The flat all-gather of ``x`` into ``out`` (rank order along dim 0); not counted."""
    if staging.stages_collectives():
        host = staging.host_like(out)
        _flat_all_gather()(host, staging.to_host(x), group=group)
        out.copy_(host)
    else:
        _flat_all_gather()(out, x, group=group)


def all_gather_raw(x: torch.Tensor, group: Any, op: str) -> torch.Tensor:
    """All-gather into a flat output along dim 0 (rank order), counted."""
    size = _group_size(group)
    out = torch.empty((size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    with phase("comm"):
        if not _recorded(group, "allgather", op, x, nbytes(x) * (size - 1)):
            all_gather_flat(out, x.contiguous(), group=group)
    _count(op, nbytes(x) * (size - 1))
    return out


def reduce_scatter_raw(x: torch.Tensor, group: Any, op: str) -> torch.Tensor:
    """Reduce-scatter (sum) along dim 0, counted."""
    size = _group_size(group)
    out = torch.empty((x.shape[0] // size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    with phase("comm"):
        if _recorded(group, "reduce_scatter", op, x, nbytes(out) * (size - 1)):
            pass
        elif staging.stages_collectives():
            host = staging.host_like(out)
            _flat_reduce_scatter()(host, staging.to_host(x), op=dist.ReduceOp.SUM, group=group)
            out.copy_(host)
        else:
            _flat_reduce_scatter()(out, x.contiguous(), op=dist.ReduceOp.SUM, group=group)
    _count(op, nbytes(out) * (size - 1))
    return out


# ---------------------------------------------------------------------------- control traffic
def scalar_device(group: Any = None) -> torch.device:
    """Where small control tensors must live for ``group``: NCCL only moves CUDA tensors."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_over_ranks(values: list[float], group: Any = None) -> list[float]:
    """Element-wise max over ranks (e.g. per-repetition times); not counted as data."""
    t = torch.tensor(values, dtype=torch.float64, device=scalar_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [float(x) for x in t.tolist()]


def gather_strings(value: str, group: Any = None) -> list[str]:
    """Every rank's ``value``, in rank order (not counted as data; e.g. host names)."""
    out: list[Any] = [None] * _group_size(group)
    dist.all_gather_object(out, value, group=group)
    return [str(v) for v in out]


def broadcast_from(x: torch.Tensor, source: int, group: Any = None) -> None:
    """``x`` of rank ``source`` into ``x`` of every rank (checks, not CP data: not counted)."""
    if staging.stages_collectives():
        host = staging.to_host(x)
        dist.broadcast(host, src=source, group=group)
        x.copy_(host)
    else:
        dist.broadcast(x, src=source, group=group)


def broadcast_floats(values: list[float], source: int = 0, group: Any = None) -> list[float]:
    """Rank ``source``'s ``values`` on every rank (decisions all ranks must share)."""
    t = torch.tensor(values, dtype=torch.float64, device=scalar_device(group))
    dist.broadcast(t, src=source, group=group)
    return [float(x) for x in t.tolist()]


def gather_floats(value: float, group: Any = None) -> list[float]:
    """Every rank's ``value``, in rank order (not counted as data)."""
    device = scalar_device(group)
    out = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(_group_size(group))]
    dist.all_gather(out, torch.tensor([value], dtype=torch.float64, device=device), group=group)
    return [float(t.item()) for t in out]
