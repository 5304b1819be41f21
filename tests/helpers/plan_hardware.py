"""A hardware profile whose costs are easy to compute by hand (planner tests)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lcab.plan.hardware import Hardware, KernelRate, Link


def hand_hardware(**changes: Any) -> Hardware:
    """1 TFLOP/s forward, 0.5 backward, no saturation or call cost; links of 1 GB/s inside a
    node and 0.25 GB/s across, without latency; memory so fast that copies cost nothing."""
    hw = Hardware(
        name="hand",
        device="cpu",
        kernels={"default": KernelRate(1.0, 0.5, 1e-9, 0.0)},
        intra=Link(1.0, 0.0),
        inter=Link(0.25, 0.0),
        efficiency={},
        memory_gib=1.0,
        memory_gbps=1e12,
    )
    return dataclasses.replace(hw, **changes)
