"""A length's mask sample, built on every rank, and under CP one answer to "did it build?".

Every rank builds the mask itself (it is deterministic from the seed, and a rank needs it to
plan its part). A construction that fails on one rank only — a host ``MemoryError`` on a node
with less free memory, say — must not let its peers walk on into the next collective while it
records the failure and leaves: they would wait there until the collective's time-out, or pair
with the wrong collective of the next length. So under CP (``world > 1``) every rank, after
its own attempt, takes part in one small collective carrying each rank's outcome (empty text
for "built"), and all ranks then follow the same verdict: the lowest failing rank's error
becomes the length's record on every rank.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from lcab.bench.results import short_error
from lcab.cell import Cell
from lcab.cp.comm import gather_strings
from lcab.masks import AttnMask, make_mask


@dataclass(frozen=True)
class MaskFailure:
    """Why a mask sample could not be built, and on which rank (the same on every rank)."""

    rank: int
    error_type: str
    error_msg: str
    detail: str
    """The error, cut shorter, for the record's reasons."""
    world: int

    @property
    def reason(self) -> str:
        """The record's reason: names the rank under CP."""
        where = f" on rank {self.rank} of {self.world}" if self.world > 1 else ""
        return f"mask construction failed{where}: {self.detail}"


@dataclass(frozen=True)
class MaskBuild:
    """One mask sample's construction: the mask and its time, or the failure every rank saw."""

    mask: AttnMask | None
    ms: float | None
    failure: MaskFailure | None


def build_mask_sample(cell: Cell, seqlen: int, sample: int, world: int) -> MaskBuild:
    """Mask sample ``sample`` of ``cell`` at ``seqlen``; under CP collective (every rank calls it).

    Never raises for a failed construction: the failure comes back, and under CP it is the
    lowest failing rank's on every rank, with no rank holding a mask.
    """
    mask: AttnMask | None = None
    ms: float | None = None
    mine = ""
    try:
        start = time.perf_counter()
        mask = make_mask(cell.mask, seqlen, seed=cell.mask_seed + sample, **cell.mask_params)
        ms = (time.perf_counter() - start) * 1e3
    except Exception as err:
        mine = json.dumps([type(err).__name__, short_error(err), short_error(err, 200)])
    every = gather_strings(mine) if world > 1 else [mine]
    for rank, text in enumerate(every):
        if text:
            error_type, error_msg, detail = json.loads(text)
            return MaskBuild(None, None, MaskFailure(rank, error_type, error_msg, detail, world))
    return MaskBuild(mask, ms, None)
