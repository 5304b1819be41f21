"""The schedule a rank executes, recorded at lcab's communication layer with nothing sent.

A rank joins through `RecordingContext`, whose process groups are `RecordedGroup`s:
`lcab.cp.comm` sees one and, instead of calling ``torch.distributed``, writes the call into the
rank's `RankSchedule` and hands back buffers of the right shape. Nothing of ``torch.distributed``
runs: PyTorch's ``fake`` backend spends ~0.5 ms in each ``batch_isend_irecv``'s Python checks,
a minute per 96-rank ring. The why and the rules: the cp guide's schedule section.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from lcab.distributed.context import DistContext

if TYPE_CHECKING:
    import torch


COLLECTIVES = ("a2a", "allgather", "reduce_scatter")
"""The blocking collectives of context parallelism (`lcab.cp.comm`)."""


class Event(NamedTuple):
    """One thing a rank issued, in its order (a tuple: a 96-rank ring records 90,000)."""

    kind: str
    """group (created) | post (sends and receives of one exchange) | wait | call (a kernel
    call) | a collective's kind (`COLLECTIVES`)."""
    pass_: str
    """build | fwd | bwd."""
    step: int
    """Kernel calls the rank made earlier in the pass (a ring's step, when no block is empty)."""
    op: str = ""
    """The operation the runner counts (``ring_kv``, ``a2a``, ...)."""
    group: tuple[int, ...] = ()
    """Global ranks of the group it is issued on."""
    tag: str = ""
    """The group's tag (twins over the same ranks are different groups)."""
    group_id: int = -1
    """The group as one number, the same on every rank (`group_id`)."""
    peer: int = -1
    """post: the rank sent to."""
    source: int = -1
    """post: the rank received from."""
    sizes: tuple[int, ...] = ()
    """post: bytes of each tensor sent (and of each received, the same shapes); collective: of
    its input."""
    sent: int = 0
    """Bytes this rank sends, as `lcab.cp.comm` counts them (the plan's accounting)."""
    dtype: str = ""
    handle: int = -1
    """post / wait: which exchange (the index of its post)."""

    def where(self, rank: int) -> str:
        """``rank 5 bwd step 3 ring_dkv`` — how a problem names this event."""
        return f"rank {rank} {self.pass_} step {self.step} {self.op or self.kind}"


@dataclass
class RankSchedule:
    """Everything one rank issued, in order (the log a `RecordedGroup` writes to)."""

    rank: int
    events: list[Event] = field(default_factory=list)
    pass_: str = "build"
    step: int = 0

    def add(self, kind: str, **fields: Any) -> None:
        """Append an event of ``kind`` at the current pass and step."""
        self.events.append(Event(kind, self.pass_, self.step, **fields))

    def start(self, pass_: str) -> None:
        """The next events belong to ``pass_``, counted from step 0."""
        self.pass_, self.step = pass_, 0

    def call(self) -> None:
        """A kernel call: the steps after it are one further on."""
        self.add("call")
        self.step += 1

    def post(
        self, op: str, group: RecordedGroup, dst: int, src: int, tensors: list[torch.Tensor]
    ) -> int:
        """An exchange: ``tensors`` to ``dst``, as many from ``src``; its handle (`wait`)."""
        self.issue("post", op, group, tensors, -1, dst, src)
        return len(self.events) - 1

    def wait(self, op: str, handle: int) -> None:
        """Waiting for exchange ``handle``."""
        self.events.append(Event("wait", self.pass_, self.step, op, handle=handle))

    def issue(
        self,
        kind: str,
        op: str,
        group: RecordedGroup,
        tensors: list[torch.Tensor],
        sent: int = -1,
        peer: int = -1,
        source: int = -1,
    ) -> None:
        """A post or a collective (``kind``) of ``tensors`` on ``group`` (``sent``: their bytes).

        Positional, as the hot path of a 96-rank ring (27,000 posts) is.
        """
        sizes = tuple([t.nbytes for t in tensors])
        handle = len(self.events) if kind == "post" else -1
        dtype = tensors[0].dtype
        name = _DTYPES.get(dtype) or _DTYPES.setdefault(dtype, str(dtype).removeprefix("torch."))
        self.events.append(
            Event(kind, self.pass_, self.step, op, group.ranks, group.tag, group.id, peer, source,
                  sizes, sum(sizes) if sent < 0 else sent, name, handle)
        )  # fmt: skip


_DTYPES: dict[Any, str] = {}


@dataclass(frozen=True)
class RecordedGroup:
    """A process group of the schedule check: its ranks and tag, and the log calls go to."""

    tag: str
    ranks: tuple[int, ...]
    log: RankSchedule = field(compare=False, repr=False)

    @functools.cached_property
    def id(self) -> int:
        """The group as one number (`group_id`)."""
        return group_id(self.tag, self.ranks)


_GROUP_IDS: dict[tuple[str, tuple[int, ...]], int] = {}


def group_id(tag: str, ranks: tuple[int, ...]) -> int:
    """A number for the group of ``ranks`` tagged ``tag``, the same in every rank's log.

    The checks key their tables by it: hashing a 96-rank tuple for each of a ring's 90,000
    events cost a second.
    """
    return _GROUP_IDS.setdefault((tag, ranks), len(_GROUP_IDS))


@dataclass
class RecordingContext(DistContext):
    """A rank's `DistContext` whose groups record (no process group is ever made)."""

    log: RankSchedule = field(default_factory=lambda: RankSchedule(0))

    def _world_group(self) -> Any:
        return RecordedGroup("", tuple(range(self.world)), self.log)

    def _new_group(self, members: tuple[int, ...], tag: str) -> Any:
        self.log.add("group", group=members, tag=tag)
        return RecordedGroup(tag, members, self.log)
