"""The tiled engine shared by the ``ranges`` and ``sparse`` kernels.

Kernels describe a mask as work items (`WorkItems`), `TiledPlan` compiles them into batches at
prepare time, the engine runs a plan forward and backward on single-threaded workers, and
`PreparedTiled` is what a kernel's ``prepare`` returns.
"""

from lcab.kernels.tiled.engine import (
    PreparedTiled,
    TiledAttention,
    plan_for,
    tiled_attention,
    tiled_caps,
)
from lcab.kernels.tiled.plan import TiledPlan, WorkItems

__all__ = [
    "PreparedTiled",
    "TiledAttention",
    "TiledPlan",
    "WorkItems",
    "plan_for",
    "tiled_attention",
    "tiled_caps",
]
