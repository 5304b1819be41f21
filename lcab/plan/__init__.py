"""The scale planner: predict context-parallel cells from their real plans before running them.

Public API::

    from lcab.plan import PlanCell, load_profile, predict
    prediction = predict(PlanCell(cp="usp", kernel="fa3", mask="causal_document", ...),
                         load_profile("h100_nvlink_ib"))
    prediction.fwd.tflops, prediction.fwd.comm_ms, prediction.memory_mib

Layers inside: `areas` (exact work of shard pairs) → `replay` (the strategy's schedule, rank by
rank) → `model` (time on a `hardware` profile) → `predict` / `recommend` / `calibrate` /
`kernel_figures` (a profile's kernel rates from public single-GPU figures,
``python -m lcab.plan.kernel_figures``) → `app` / `cli` (``python -m lcab.plan``).
"""

from lcab.plan.hardware import Hardware, list_profiles, load_profile
from lcab.plan.predict import CellPrediction, PlanCell, predict

__all__ = ["CellPrediction", "Hardware", "PlanCell", "list_profiles", "load_profile", "predict"]
