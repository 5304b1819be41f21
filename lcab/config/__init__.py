"""The Hydra side of lcab: config schemas, resolution into a `Cell`, and the sweep pre-flight.

``schema`` registers the structured configs, ``resolve`` turns one composed config into a
`lcab.cell.Cell` (or a `ConfigError` naming key, value and valid options), ``preflight`` checks
every job of a run or sweep before anything is launched.
"""

from pathlib import Path

from lcab.config.job import job_info
from lcab.config.resolve import ConfigError, resolve_cell
from lcab.config.schema import cp_config_classes, register_configs

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
"""The repository's ``conf/`` folder (the Hydra config tree), defined once."""

__all__ = [
    "CONF_DIR",
    "ConfigError",
    "cp_config_classes",
    "job_info",
    "register_configs",
    "resolve_cell",
]
