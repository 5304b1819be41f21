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


@dataclass
class BenchConfig:
    """The measurement protocol.

    One definition serves as the Hydra schema of ``conf/bench/`` and as the typed settings
    every rank reads, so a setting cannot be read under a misspelt key.
    """

    passes: list[str] = field(default_factory=lambda: ["fwd", "bwd"])
    """Passes to time: fwd, bwd (forward outside the timer), fwd_bwd."""
    warmup: int = 2
    """Untimed calls after the first one."""
    reps: int = 5
    """Timed repetitions per pass and mask sample."""
    warmup_ms: float | None = None
    """Warm-up time budget instead of a count."""
    rep_ms: float | None = None
    """Timing time budget instead of a count (reps = budget / estimated call time)."""
    max_reps: int = 1000
    """Cap on repetitions in budget mode."""
    quantiles: list[float] = field(default_factory=lambda: [0.5, 0.2, 0.8])
    """Time quantiles recorded (p50 is the reported figure)."""
    mask_samples: int = 3
    """Random masks (documents, prefixes, sparse picks) drawn per length; median reported
    (paper: 30). Deterministic masks are drawn once."""
    check_numerics: bool = True
    """Compare out/lse (fwd) and dq/dk/dv (bwd) with the fp64 reference."""
    numerics_full_max: int = 1 << 26
    """Use the whole fp64 reference up to heads_q·Sq·Sk of this; above, sampled rows."""
    numerics_rows: int = 128
    """Query rows checked in sampled mode."""
    tolerance: float | None = None
    """Normalised max-error tolerance; None: by dtype (fp64 1e-8, fp32 1e-3, fp16 1e-2,
    bf16 5e-2)."""
    memory: bool = True
    """Record peak memory (CUDA allocator peak; CPU sampled RSS) during the timed region."""
    flush_l2: bool = True
    """CUDA: zero a 256 MB buffer before each repetition."""
    timeout_s: float = 1800.0
    """Hard limit per (cell, seqlen); a worker past it is killed and the record says timeout."""
    isolate: bool = True
    """Run each cell in supervised worker processes (hard timeout; a crash becomes a record)."""
    threads: int | None = None
    """torch threads per rank on CPU; None: torch's default for one rank, 1 per rank under CP."""
    progress: bool = True
    """Show a progress bar over lengths x passes."""
    profile: bool = False
    """Record a PyTorch profiler trace (Chrome JSON, ``traces/`` in the job folder) of every
    (length, pass) on extra repetitions after the timed ones, so profiling never skews a time."""
    profile_reps: int = 3
    """Repetitions inside each profiled trace."""


@dataclass(frozen=True)
class JobInfo:
    """Where a job writes and how it is identified in records."""

    output_dir: str
    run_id: str = ""
    sweep_id: str = ""
    job_num: int | None = None
    override_dirname: str = ""
    overrides: tuple[str, ...] = ()
    """The job's own command-line overrides (``hydra.overrides.task``)."""


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
    bench: BenchConfig
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
