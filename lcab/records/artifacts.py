"""Files a cell leaves in its job folder beside the records, named once for writer and loggers.

`lcab.bench.artifacts` writes them; `lcab.records.wandb_run` uploads them (the W&B logger sits
below the bench layer, so the names live here).
"""

from __future__ import annotations

from pathlib import Path

TRACES_DIR = "traces"
"""Job-folder sub-folder of the profiler traces, ``S<seqlen>-<pass>-rank<r>.json``."""

MASK_PICTURE = "mask-S{seqlen}.png"
"""Job-folder file name of the mask picture of the cell's largest length."""


def trace_files(job_dir: str | Path) -> list[Path]:
    """The traces a job folder holds, sorted."""
    return sorted((Path(job_dir) / TRACES_DIR).glob("S*-*-rank*.json"))


def mask_pictures(job_dir: str | Path) -> list[Path]:
    """The mask pictures a job folder holds, largest length last."""
    found = Path(job_dir).glob(MASK_PICTURE.format(seqlen="*"))
    return sorted(found, key=lambda p: int(p.stem.rsplit("S", 1)[-1]))
