"""Structured configs of the Hydra app, registered in Hydra's ConfigStore.

Every group option's schema is a dataclass, so typos (``mask.windw=1``) and type errors fail at
compose time with the key named. Mask, kernel and CP schemas are *generated* from the
registries' parameter/options dataclasses, so there is no second list to keep in sync. Schemas
live under ``schema/<group>/<name>``; ``conf/<group>/`` YAML options extend them. Cross-field
rules are `lcab.config.preflight`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from lcab.cell import BenchConfig
from lcab.config.launcher import LcabSlurmConf
from lcab.cp import STRATEGIES
from lcab.kernels import KERNELS
from lcab.masks.patterns import MASK_PATTERNS

# ---------------------------------------------------------------------------- base schemas


@dataclass
class KernelConfig:
    """Which attention kernel runs the cell."""

    name: str = MISSING
    """Registered kernel name (python -c 'import lcab.kernels as k; print(k.list_kernels())')."""


@dataclass
class MaskConfig:
    """Which mask, with the pattern's own parameters (generated per pattern)."""

    name: str = MISSING
    """Registered pattern name or alias (python -m lcab.masks --list)."""
    seed: int | None = None
    """Seed of the first mask sample (sample i uses seed + i); None: the top-level seed."""


@dataclass
class CPConfig:
    """Context-parallel strategy (``none``: one device); each adds its ``options_cls`` fields."""

    name: str = "none"
    """none, or a registered strategy (ulysses, ring, ring_allgather, usp, loongtrain)."""
    balance: str = "zigzag"
    """Token placement over ranks: contiguous | zigzag (the paper's) | area (mask-aware)."""


@dataclass
class SeqlenConfig:
    """Sequence lengths swept inside one job."""

    name: str = "custom"
    """Preset name (for records); overriding values keeps it."""
    values: list[int] = field(default_factory=lambda: [4096])
    """Total packed tokens per cell (or per device with per_device=true)."""
    per_device: bool = False
    """Weak scaling: each value is tokens per device; total = value x world size."""
    frontier: bool = False
    """Search the longest length that fits in memory from the one value (`lcab.bench.frontier`)."""
    frontier_max: int = 1 << 20
    """Longest length a frontier search probes (per device with per_device=true)."""
    frontier_resolution: int = 16
    """The search stops when the bracket is within 1/frontier_resolution of the length that fits."""


@dataclass
class TopologyConfig:
    """Nodes x devices per node, and how ranks talk."""

    name: str = "auto"
    nodes: int = 1
    """Number of nodes (SLURM nodes; locally, emulated)."""
    devices_per_node: int | None = None
    """Ranks per node; None: 1 for cp=none, else 4 on CPU or every visible GPU."""
    backend: str = "auto"
    """auto (nccl on GPU, gloo on CPU) | gloo | nccl (gloo on cuda: ranks may share a GPU)."""
    nccl_high_priority: bool = False
    """NCCL's communication on high-priority CUDA streams (ProcessGroupNCCL.Options)."""


@dataclass
class ProblemConfig:
    """The attention problem (batch 1, packed). None/auto picks GPU or CPU-sized defaults."""

    heads_q: int | None = None
    """Query heads; None: 64 on GPU (paper), 8 on CPU."""
    heads_kv: int | None = None
    """KV heads; None: 8 on GPU (GQA 64:8, paper), 2 on CPU."""
    head_dim: int | None = None
    """Head dim; None: 128 on GPU (paper), 64 on CPU."""
    dtype: str = "auto"
    """auto (bfloat16 on GPU, float32 on CPU) | float32 | bfloat16 | float16 | float64."""
    device: str = "auto"
    """auto (cuda if visible, else cpu) | cpu | cuda."""


@dataclass
class LoggerConfig:
    """Extra record sinks; records always go to records.jsonl and the console."""

    name: str = "none"


@dataclass
class WandbLoggerConfig(LoggerConfig):
    """Weights & Biases: one run per cell (job), logged by rank 0 only."""

    name: str = "wandb"
    project: str = "lcab"
    entity: str | None = None
    mode: str | None = None
    """online | offline | disabled; None: $WANDB_MODE, else offline (online falls back to it)."""
    init_timeout_s: float = 20.0
    """How long an online start may take before lcab logs offline instead."""
    group: str | None = None
    """W&B group; None: the sweep id."""
    tags: list[str] = field(default_factory=list)


@dataclass
class LcabConfig:
    """The whole run: one cell (kernel x cp x mask x topology) over a list of lengths."""

    kernel: KernelConfig = MISSING
    cp: CPConfig = MISSING
    mask: MaskConfig = MISSING
    seqlen: SeqlenConfig = MISSING
    topology: TopologyConfig = MISSING
    bench: BenchConfig = MISSING
    logger: LoggerConfig = MISSING
    problem: ProblemConfig = field(default_factory=ProblemConfig)
    seed: int = 0
    """Seed of inputs and (unless mask.seed is set) of the masks."""
    study: str = "lcab"
    """Name of the study; prefixes sweep ids."""
    resume: bool = False
    """Run only the lengths the job's output folder has not settled (`lcab.records.resume`)."""
    dry_run: bool = False
    """Print every job's shape, prediction and GPU-hours, then stop (nothing runs)."""
    hardware: Any = None
    """The profile predictions use (conf/hardware/); None: by device (`h100_nvlink_ib`, CPU)."""


@dataclass
class PlanConfig(LcabConfig):
    """``python -m lcab.plan``: the benchmark's groups plus a hardware profile (conf/plan.yaml)."""

    hardware: Any = MISSING
    """A hardware profile (conf/hardware/<name>.yaml): rates, links, memory, their sources."""
    recommend: bool = False
    """Rank every strategy, balancer and Ulysses degree for the cell, and the smallest world."""
    records: str | None = None
    """A records file (JSONL): its measured points are overlaid on the sweep's plot."""
    harness: str = "lcab"
    """Whose strategies to cost (`lcab.plan.harness`): ``lcab``, or ``longca`` (published ones)."""


# ---------------------------------------------------------------------------- generation

_SIMPLE = {"int": int, "float": float, "str": str, "bool": bool}


def _annotation(declared: Any) -> Any:
    """Turn a (string) annotation of a plain dataclass into one OmegaConf understands."""
    text = str(declared).replace(" ", "")
    optional = text.endswith("|None")
    base = text.removesuffix("|None")
    if base in _SIMPLE:
        tp: Any = _SIMPLE[base]
    elif base.startswith("list[") and base[5:-1] in _SIMPLE:
        tp = typing.List[_SIMPLE[base[5:-1]]]  # type: ignore[misc]  # noqa: UP006 (OmegaConf reads typing.List)
    else:
        raise TypeError(f"unsupported config field type {declared!r}")
    return Optional[tp] if optional else tp  # noqa: UP045 (OmegaConf 2.3 reads typing.Optional)


def _generated(
    name: str,
    base: type,
    suffix: str,
    source: type | None,
    overrides: dict[str, tuple[Any, Any]] | None = None,
) -> type:
    fields_: list[tuple[str, Any, Any]] = [("name", str, field(default=name))]
    for f in dataclasses.fields(source) if source else []:
        tp, default = _annotation(f.type), f.default
        if overrides and f.name in overrides:
            tp, default = overrides[f.name]
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            fields_.append((f.name, tp, field(default_factory=f.default_factory)))
        else:
            fields_.append((f.name, tp, field(default=default)))
    class_name = "".join(part.title() for part in name.split("_")) + suffix
    cls = dataclasses.make_dataclass(class_name, fields_, bases=(base,))
    cls.__doc__ = f"Config of {name} (generated from {source.__name__ if source else 'nothing'})."
    # a module attribute, so that configs typed by it pickle (`lcab.config.fork_map` sends
    # composed configs between processes); pickle finds a class by module and name
    cls.__module__ = __name__
    existing: type = globals().setdefault(cls.__name__, cls)
    if existing is not cls and _shape(existing) != _shape(cls):
        raise RuntimeError(f"two different generated config classes named {cls.__name__}")
    return existing


def _shape(cls: type) -> list[tuple[str, Any, Any]]:
    """Fields of a generated config class as comparable values."""
    return [(f.name, f.type, f.default) for f in dataclasses.fields(cls)]


def mask_config_classes() -> dict[str, type]:
    """One MaskConfig subclass per pattern, with the pattern's parameters as fields.

    ``heads`` of block-sparse patterns defaults to None, meaning the problem's KV heads.
    """
    out = {}
    for name in MASK_PATTERNS.names():
        pattern = MASK_PATTERNS.get(name)
        has_heads = "heads" in pattern.param_names()
        overrides = {"heads": (Optional[int], None)} if has_heads else None  # noqa: UP045
        out[name] = _generated(name, MaskConfig, "MaskConfig", pattern.params_cls, overrides)
    return out


def cp_config_classes() -> dict[str, type]:
    """``none`` plus one CPConfig subclass per registered strategy, with its options as fields."""
    out: dict[str, type] = {"none": CPConfig}
    for name in STRATEGIES.names():
        out[name] = _generated(name, CPConfig, "CPConfig", STRATEGIES.get(name).options_cls)
    return out


def kernel_config_classes() -> dict[str, type]:
    """One KernelConfig subclass per registered kernel, with its options as fields."""
    return {
        name: _generated(name, KernelConfig, "KernelConfig", KERNELS.get(name).options_cls)
        for name in KERNELS.names()
    }


_REGISTERED = False
#: Longest job-folder name kept whole (file systems refuse names over 255 bytes).
DIRNAME_MAX = 160


def short_dirname(name: str) -> str:
    """``name`` if short enough, else its start plus a hash of the whole (still unique)."""
    if len(name.encode()) <= DIRNAME_MAX:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return f"{name.encode()[: DIRNAME_MAX - 13].decode(errors='ignore')}_{digest}"


_PROCESS_UID = uuid.uuid4().hex[:6]


def __getattr__(name: str) -> type:
    """A generated config class by name, made on first use (PEP 562) for unpickling processes."""
    if name.endswith("Config") and not name.startswith("_"):
        kernel_config_classes()
        mask_config_classes()
        cp_config_classes()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent; call before composing)."""
    global _REGISTERED
    if _REGISTERED:
        return
    if not OmegaConf.has_resolver("lcab_uid"):
        # a short id fixed for this process, suffixed to run/sweep folders
        OmegaConf.register_new_resolver("lcab_uid", lambda: _PROCESS_UID, use_cache=True)
    if not OmegaConf.has_resolver("lcab_dirname"):
        # a job folder named by its overrides, cut to fit file systems' 255-byte names
        OmegaConf.register_new_resolver("lcab_dirname", short_dirname)
    cs = ConfigStore.instance()
    cs.store(name="lcab_schema", node=LcabConfig)
    cs.store(name="lcab_plan_schema", node=PlanConfig)
    for name, cls in kernel_config_classes().items():
        cs.store(group="schema/kernel", name=name, node=cls)
    for name, cls in mask_config_classes().items():
        cs.store(group="schema/mask", name=name, node=cls)
    for name, cls in cp_config_classes().items():
        cs.store(group="schema/cp", name=name, node=cls)
    for group, cls in (
        ("seqlen", SeqlenConfig),
        ("topology", TopologyConfig),
        ("bench", BenchConfig),
        ("logger", LoggerConfig),
    ):
        cs.store(group=f"schema/{group}", name="base", node=cls)
    cs.store(group="schema/logger", name="wandb", node=WandbLoggerConfig)
    cs.store(group="hydra/launcher", name="lcab_slurm", node=LcabSlurmConf, provider="lcab")
    _REGISTERED = True
