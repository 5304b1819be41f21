"""A length's mask sample, built on every rank, and under CP one answer to "did it build?".

A construction that fails on one rank only (a host ``MemoryError``) must not let its peers walk
into the next collective and wait there until its time-out: under CP every rank shares its
outcome in one small collective and all follow the lowest failing rank's error.
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
    """Mask sample ``sample`` of ``cell`` at ``seqlen`` (collective under CP; never raises)."""
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
