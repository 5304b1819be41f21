"""Launching cells on a cluster: SLURM job shapes, the shaped launcher, job outcomes.

Hydra instantiates launchers only from the ``hydra_plugins`` namespace, and only classes it can
import by name. Rather than ship a second top-level package, `register_launcher` creates the
module ``hydra_plugins.lcab_slurm`` in memory, holding an empty subclass of lcab's launcher, and
registers it with Hydra (the ``_target_`` of the ``lcab_slurm`` launcher config). submitit
pickles the launcher into every job with cloudpickle; that module is registered to be pickled
*by value*, so a compute node needs nothing but lcab itself installed.
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
