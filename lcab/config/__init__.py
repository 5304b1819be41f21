"""The Hydra side of lcab: config schemas, resolution into a `Cell`, and the sweep pre-flight.

Schemas and resolution read the kernel, mask and strategy registries (torch), so
`register_configs`, `resolve_cell` and `cp_config_classes` are imported on first use (PEP 562):
``import lcab.config`` (``lcab.main``, ``--help``) stays free of torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcab.config.errors import ConfigError
from lcab.config.job import job_info

if TYPE_CHECKING:
    from lcab.config.resolve import resolve_cell
    from lcab.config.schema import cp_config_classes, register_configs

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
"""The repository's ``conf/`` folder (the Hydra config tree), defined once."""

_LAZY = {
    "resolve_cell": "lcab.config.resolve",
    "register_configs": "lcab.config.schema",
    "cp_config_classes": "lcab.config.schema",
}


def __getattr__(name: str) -> Any:
    """The heavy names of `_LAZY`, imported from their module on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "CONF_DIR",
    "ConfigError",
    "cp_config_classes",
    "job_info",
    "register_configs",
    "resolve_cell",
]
