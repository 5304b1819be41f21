"""Launching cells on a cluster: SLURM job shapes, the shaped launcher, job outcomes.

Hydra instantiates launchers only from the ``hydra_plugins`` namespace, so `register_launcher`
creates ``hydra_plugins.lcab_slurm`` in memory (no second top-level package), pickled *by value*
into every job, so a compute node needs only lcab installed.
"""

from __future__ import annotations

import sys
import types

_REGISTERED = False


def register_launcher() -> None:
    """Make ``hydra/launcher=lcab_slurm`` instantiable (idempotent; before Hydra runs)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import cloudpickle
    import hydra_plugins
    from hydra.core.plugins import Plugins

    from lcab.config.launcher import LAUNCHER_TARGET
    from lcab.launch.slurm_launcher import ShapedSlurmLauncher

    module_name, class_name = LAUNCHER_TARGET.rsplit(".", 1)
    module = types.ModuleType(module_name, "lcab's SLURM launcher, registered in memory.")
    registered = type(class_name, (ShapedSlurmLauncher,), {"__module__": module_name})
    setattr(module, class_name, registered)
    sys.modules[module_name] = module
    setattr(hydra_plugins, module_name.rsplit(".", 1)[1], module)
    cloudpickle.register_pickle_by_value(module)
    Plugins.instance().register(registered)
    _REGISTERED = True
