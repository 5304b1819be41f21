"""A throw-away plugin: a kernel, a mask and a CP strategy registered from outside lcab.

Importing this module (or ``pytest -p tests.helpers.registry_plugin``) registers them exactly
as a new adapter, pattern or strategy module does — a decorator at import — and touches no
other file;
`tests/unit/test_registry_plugin.py` then finds each in every list lcab derives from its
registries. With ``LCAB_PLUGIN_REFERENCE=0`` the mask comes without its test reference, to show
that the mask tests then fail rather than skip it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from lcab.cp.base import register_strategy
from lcab.cp.hybrid import RingP2P
from lcab.kernels import register_kernel
from lcab.kernels.naive import NaiveKernel
from lcab.kernels.packages import PackageProbe
from lcab.masks.geometry import SliceKind
from lcab.masks.patterns.base import Generated, PatternParams, diagonal_blocks, register_pattern
from tests.helpers import mask_reference

KERNEL = "plugin_naive"
STRATEGY = "plugin_ring"
MASK = "plugin_pairs"
COLOUR = "#010203"
INSTALL = 'pip install "numpy"  # lcab registry plugin test'


@register_kernel
class PluginKernel(NaiveKernel):
    """The naive kernel under another name, calling an optional package (numpy, installed)."""

    name = KERNEL
    summary = "registry plugin test: naive attention"
    colour = COLOUR
    gpu_compared = True
    caps = dataclasses.replace(
        NaiveKernel.caps,
        requires=PackageProbe(module="numpy", distributions=("numpy",), install=INSTALL),
    )


@register_strategy
class PluginRing(RingP2P):
    """Ring P2P under another name: every list must find it, and it must run as the ring."""

    name = STRATEGY
    summary = "registry plugin test: Ring P2P"


def rank_main(*args: Any) -> None:
    """`tests.distributed.grid.rank_main` in a spawned rank, which must import this module too
    (lcab's own strategies are imported by ``lcab.cp``; a plugin's by whoever uses it)."""
    from tests.distributed.grid import rank_main as grid_rank_main

    grid_rank_main(*args)


@dataclasses.dataclass
class PairParams(PatternParams):
    """No parameters."""


@register_pattern(MASK, PairParams, "i // 2 = j // 2: tokens attend their pair")
def pairs(seqlen: int, rng: np.random.Generator, p: PairParams) -> Generated:
    """One full 2 x 2 block per token pair (the last one alone when S is odd)."""
    cu = np.unique(np.append(np.arange(0, seqlen, 2), seqlen))
    return Generated(diagonal_blocks(cu, SliceKind.FULL))


def _pair_dense(seqlen: int, params: dict[str, Any], doc_lengths: Any) -> np.ndarray:
    i, j = mask_reference.grid(seqlen)
    return i // 2 == j // 2


if os.environ.get("LCAB_PLUGIN_REFERENCE", "1") != "0":
    mask_reference.register_reference(
        MASK, mask_reference.Reference(mask_reference.no_params, dense=_pair_dense)
    )
