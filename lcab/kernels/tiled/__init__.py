"""The tiled engine shared by the ``ranges`` and ``sparse`` kernels.

Kernels describe a mask as work items (`items`), `plan` compiles them into batches at prepare
time, `engine` runs a plan forward and backward on single-threaded `workers` over the packed
`buffers`; `engine.PreparedTiled` is what a kernel's ``prepare`` returns.
"""

from lcab.kernels.tiled.engine import (
    PreparedTiled,
    plan_for,
    tiled_attention,
    tiled_attention_function,
)
from lcab.kernels.tiled.items import WorkItems
from lcab.kernels.tiled.plan import TiledPlan

__all__ = [
    "PreparedTiled",
    "TiledPlan",
    "WorkItems",
    "plan_for",
    "tiled_attention",
    "tiled_attention_function",
]
