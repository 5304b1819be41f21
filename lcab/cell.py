"""`Cell`: one benchmark cell as plain, picklable data — what every layer above agrees on.

A cell is a kernel x cp x mask x topology over a list of sequence lengths, with everything
"auto" already made concrete (device, dtype, head counts, world size, sequence totals, mask
samples), so worker processes and records see exactly what ran. `lcab.config.resolve` builds
it from a composed config; the benchmark runner, the records and the loggers only read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


@dataclass(frozen=True)
class JobInfo:
    """Where a job writes and how it is identified in records."""

    output_dir: str
    run_id: str = ""
    sweep_id: str = ""
    job_num: int | None = None
    override_dirname: str = ""


@dataclass(frozen=True)
class Cell:
    """Everything a rank needs to run one cell (no OmegaConf objects: it is pickled)."""

    kernel: str
    kernel_options: dict[str, Any]
    cp: str
    cp_options: dict[str, Any]
    mask: str
    mask_params: dict[str, Any]
    mask_seed: int
    mask_samples: int
    seqlens: tuple[int, ...]
    seqlen_per_device: tuple[int, ...] | None
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    device: str
    nodes: int
    devices_per_node: int
    backend: str
    bench: dict[str, Any]
    seed: int
    config: dict[str, Any] = field(default_factory=dict)
    job: JobInfo = field(default_factory=lambda: JobInfo(output_dir="."))

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.nodes * self.devices_per_node

    @property
    def torch_dtype(self) -> torch.dtype:
        """The problem dtype as a torch dtype."""
        return DTYPES[self.dtype]

    def with_job(self, job: JobInfo) -> Cell:
        """The same cell, writing for ``job``."""
        return dataclasses.replace(self, job=job)

    def with_seqlens(self, seqlens: Sequence[int]) -> Cell:
        """The same cell over a subset of its lengths (per-device values follow their totals)."""
        per_device = self.seqlen_per_device
        if per_device is not None:
            by_total = dict(zip(self.seqlens, per_device, strict=True))
            per_device = tuple(by_total[s] for s in seqlens)
        return dataclasses.replace(self, seqlens=tuple(seqlens), seqlen_per_device=per_device)
