"""The scale planner: predict context-parallel cells from their real plans before running them.

Public API::

    from lcab.plan import PlanCell, load_profile
    from lcab.plan.predict import predict
    prediction = predict(PlanCell(cp="usp", kernel="fa3", mask="causal_document", ...),
                         load_profile("h100_nvlink_ib"))
    prediction.fwd.tflops, prediction.fwd.comm_ms, prediction.memory_mib

Layers inside: `areas` (exact work of shard pairs) → `replay` (the strategy's schedule, rank by
rank) → `model` (time on a `hardware` profile) → `predict` / `recommend` / `calibrate` (held to
records) / `kernel_figures` (a profile's kernel rates from public single-GPU figures,
``python -m lcab.plan.kernel_figures``) → `app` / `cli` (``python -m lcab.plan``). The lab tools
that measure or fit a profile's numbers are ``launchers/plan_*.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lcab.plan.hardware import Hardware, list_profiles, load_profile

if TYPE_CHECKING:
    from lcab.plan.predict import CellPrediction, PlanCell


def __getattr__(name: str) -> Any:
    """The prediction types, imported on first use (they load torch; ``--help`` does not).

    ``predict`` is the function's own module's (`lcab.plan.predict.predict`): as a package
    attribute the name is the submodule once anything imports it.
    """
    if name not in ("CellPrediction", "PlanCell"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("lcab.plan.predict"), name)
    globals()[name] = value
    return value


__all__ = ["CellPrediction", "Hardware", "PlanCell", "list_profiles", "load_profile"]
