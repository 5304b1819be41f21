"""`Cell`: one benchmark cell as plain, picklable data — what every layer above agrees on.

A kernel x cp x mask x topology over a list of lengths, every "auto" made concrete, so workers
and records see exactly what ran. `lcab.config.resolve` builds it; everything else reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a dtype is needed: `import lcab.cell` stays light
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")
"""The problem dtypes lcab runs, by the name configs and records use."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of one of `DTYPE_NAMES` (KeyError for any other name)."""
    import torch

    if name not in DTYPE_NAMES:
        raise KeyError(name)
    dtype: torch.dtype = getattr(torch, name)
    return dtype


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
"""Bytes per element of each of `DTYPE_NAMES` (torch's ``itemsize``, known without importing it)."""


def dtype_name(dtype: torch.dtype | str) -> str:
    """The name of a torch dtype (``torch.bfloat16`` -> ``bfloat16``); a name is returned as is."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element of a torch dtype or a dtype name (the planner's problems are named)."""
    return DTYPE_BYTES[dtype] if isinstance(dtype, str) else int(dtype.itemsize)


TELEMETRY_MODES = ("auto", "nvml", "host", "off")
"""``bench.telemetry``: where clocks, power and energy are read (`BenchConfig.telemetry`)."""


@dataclass
class BenchConfig:
    """The measurement protocol: the Hydra schema of ``conf/bench/`` and the settings ranks read."""

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
    """Record peak memory (CUDA allocator peak; CPU RSS high-water mark) of the measured calls."""
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
    """Trace every (length, pass) with the PyTorch profiler (``traces/``) on extra repetitions."""
    profile_reps: int = 3
    """Repetitions inside each profiled trace."""
    telemetry: str = "auto"
    """Clocks, power and energy beside the timed repetitions (`lcab.bench.telemetry`)."""
    telemetry_interval_ms: float | None = None
    """None: read at the window's two ends; a number: a thread also polls every that many ms."""
    memory_budget_gib: float | None = None
    """Memory each rank may use (a frontier below the device's size); above it: ``oom``."""


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
class FrontierSearch:
    """``seqlen=frontier``: search the longest length that fits (`lcab.bench.frontier`)."""

    max_tokens: int
    resolution: int


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
    frontier: FrontierSearch | None = None
    """Set by ``seqlen=frontier``: the cell searches its memory frontier."""

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.nodes * self.devices_per_node

    @property
    def torch_dtype(self) -> torch.dtype:
        """The problem dtype as a torch dtype."""
        return torch_dtype(self.dtype)

    def with_seqlens(self, seqlens: Sequence[int]) -> Cell:
        """The same cell over a subset of its lengths (per-device values follow their totals)."""
        per_device = self.seqlen_per_device
        if per_device is not None:
            by_total = dict(zip(self.seqlens, per_device, strict=True))
            per_device = tuple(by_total[s] for s in seqlens)
        return dataclasses.replace(self, seqlens=tuple(seqlens), seqlen_per_device=per_device)

    def at_length(self, seqlen: int) -> Cell:
        """The same cell at one total length of any size (a frontier probe)."""
        per_device = None if self.seqlen_per_device is None else (seqlen // self.world_size,)
        return dataclasses.replace(self, seqlens=(seqlen,), seqlen_per_device=per_device)


TILE_TOKENS = 128
"""Query rows of one FlashAttention tile (FA2/FA3 forward): a rank with fewer holds less than
one tile, which the kernel pads."""

FULL_RATE_TOKENS = 1024
"""Tokens per rank below which a GPU attention call runs well under its plateau (FlashAttention-3
paper, H100, D=128: backward 424 of 561 TFLOP/s at 1K tokens, 316 at 512)."""


def tokens_per_rank(seqlen: int, world: int) -> int:
    """Tokens each of ``world`` CP ranks holds, rounded up (a balancer pads to equal shards)."""
    return -(-seqlen // max(world, 1))


def few_tokens_warning(seqlens: Sequence[int], world: int, device: str) -> str:
    """Why the lengths measure launches, not the strategy, on ``world`` GPUs ("" when fine).

    Only GPU cells are warned (`FULL_RATE_TOKENS` is a GPU kernel's figure).
    """
    if world <= 1 or device != "cuda":
        return ""
    short = [s for s in seqlens if tokens_per_rank(s, world) < FULL_RATE_TOKENS]
    if not short:
        return ""
    fewest = tokens_per_rank(min(short), world)
    what = (
        f"fewer than one {TILE_TOKENS}-row attention tile"
        if fewest < TILE_TOKENS
        else f"under {FULL_RATE_TOKENS:,}, where a kernel call runs well below its plateau"
    )
    lengths = ", ".join(f"{s:,}" for s in short)
    return (
        f"{len(short)} of {len(seqlens)} lengths ({lengths}) leave each of the {world} ranks as "
        f"few as {fewest:,} tokens ({what}): the cell measures launches, not the strategy; "
        "seqlen=per_device_8k gives every GPU 8K tokens (the paper's CP protocol)"
    )
