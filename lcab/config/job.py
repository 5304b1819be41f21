"""`job_info`: where a Hydra job writes and how its records are identified.

One function for the compute node and the launcher, so the launcher's failure records carry
the job's own identity.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lcab.cell import JobInfo


def job_info(hydra: DictConfig, multirun: bool) -> JobInfo:
    """The `JobInfo` of a job from its ``hydra`` config node."""
    output = OmegaConf.select(hydra, "runtime.output_dir", default=None)
    if not output:
        output = (
            os.path.join(str(hydra.sweep.dir), str(hydra.sweep.subdir))
            if multirun
            else str(hydra.run.dir)
        )
    output_dir = Path(os.path.abspath(str(output)))
    sweep_id = Path(str(hydra.sweep.dir)).name if multirun else output_dir.name
    num = int(hydra.job.num) if multirun else None
    return JobInfo(
        output_dir=str(output_dir),
        run_id=f"{sweep_id}-{num}" if num is not None else sweep_id,
        sweep_id=sweep_id,
        job_num=num,
        override_dirname=str(hydra.job.override_dirname),
        overrides=tuple(
            str(o) for o in OmegaConf.select(hydra, "overrides.task", default=[]) or []
        ),
    )
