"""`resolve_cell`: a composed config checked and made concrete as a `lcab.cell.Cell`.

Every "auto" becomes concrete here, so workers and records see exactly what ran; anything
invalid raises `ConfigError` (key, value, valid options), which the pre-flight collects.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from lcab.cell import (
    DTYPE_NAMES,
    TELEMETRY_MODES,
    BenchConfig,
    Cell,
    FrontierSearch,
    JobInfo,
)
from lcab.config.errors import ConfigError
from lcab.config.launcher import LAUNCHER_TARGET
from lcab.cp import STRATEGIES
from lcab.flops import PASSES
from lcab.kernels import KERNELS
from lcab.lazy import lazy_module
from lcab.masks import get_pattern, make_params
from lcab.registry import UnknownNameError

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

CPU_PROBLEM = {"heads_q": 8, "heads_kv": 2, "head_dim": 64, "dtype": "float32"}
GPU_PROBLEM = {"heads_q": 64, "heads_kv": 8, "head_dim": 128, "dtype": "bfloat16"}
BACKENDS = ("auto", "gloo", "nccl")
#: Local ranks for cp != none when the topology leaves it open, on CPU.
CPU_CP_RANKS = 4


def _container(node: Any) -> dict[str, Any]:
    """A config node as a plain dict (every lcab node is a mapping)."""
    out = OmegaConf.to_container(node, resolve=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def _positive(key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(key, value, "must be an integer >= 1")
    return value


def job_device(cfg: DictConfig) -> str:
    """What ``problem.device=auto`` means for the job: where it will run, not where it is composed.

    ``hydra.launcher.gpus_per_rank`` >= 1 means CUDA even on a login node without a GPU;
    elsewhere (and inside the job) the host decides.
    """
    launcher = OmegaConf.select(cfg, "hydra.launcher", default=None)
    if launcher is not None and OmegaConf.select(launcher, "_target_") == LAUNCHER_TARGET:
        gpus = OmegaConf.select(launcher, "gpus_per_rank", default=0)
        if isinstance(gpus, int) and gpus >= 1:
            return "cuda"
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_cell(cfg: DictConfig, job: JobInfo | None = None) -> Cell:
    """Resolve and check a composed config.

    Raises ConfigError: the first invalid value (key, value, valid options).
    """
    kernel_name = str(cfg.kernel.name)
    if kernel_name not in KERNELS:
        raise ConfigError("kernel", kernel_name, f"valid: {', '.join(KERNELS.names())}")
    kernel_options = {k: v for k, v in _container(cfg.kernel).items() if k != "name"}
    try:
        KERNELS.get(kernel_name)(**kernel_options)
    except (TypeError, ValueError) as err:
        raise ConfigError("kernel", kernel_options, str(err)) from err

    cp_name = str(cfg.cp.name)
    cp_names = ("none", *STRATEGIES.names())
    if cp_name not in cp_names:
        raise ConfigError("cp", cp_name, f"valid: {', '.join(cp_names)}")
    cp_options = {k: v for k, v in _container(cfg.cp).items() if k != "name"}

    # problem: "auto" -> GPU or CPU defaults
    p = cfg.problem
    device = str(p.device)
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError("problem.device", device, "valid: auto, cpu, cuda")
    if device == "auto":
        device = job_device(cfg)
    defaults = GPU_PROBLEM if device == "cuda" else CPU_PROBLEM
    heads_q = _positive("problem.heads_q", defaults["heads_q"] if p.heads_q is None else p.heads_q)
    heads_kv = _positive(
        "problem.heads_kv", defaults["heads_kv"] if p.heads_kv is None else p.heads_kv
    )
    head_dim = _positive(
        "problem.head_dim", defaults["head_dim"] if p.head_dim is None else p.head_dim
    )
    if heads_q % heads_kv:
        raise ConfigError(
            "problem.heads_q", heads_q, f"must be a multiple of problem.heads_kv={heads_kv} (GQA)"
        )
    dtype = defaults["dtype"] if p.dtype == "auto" else str(p.dtype)
    if dtype not in DTYPE_NAMES:
        raise ConfigError("problem.dtype", dtype, f"valid: auto, {', '.join(DTYPE_NAMES)}")

    # topology
    t = cfg.topology
    nodes = _positive("topology.nodes", t.nodes)
    if t.devices_per_node is None:
        if cp_name == "none":
            devices = 1
        elif device == "cuda":
            devices = max(torch.cuda.device_count(), 1)
        else:
            devices = CPU_CP_RANKS
    else:
        devices = _positive("topology.devices_per_node", t.devices_per_node)
    if cp_name == "none" and nodes * devices != 1:
        raise ConfigError(
            "topology",
            str(t.name),
            "cp=none runs on one device; choose a cp strategy for "
            f"{nodes * devices} ranks or topology=single",
        )
    backend = str(t.backend)
    if backend not in BACKENDS:
        raise ConfigError("topology.backend", backend, f"valid: {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    world = nodes * devices

    # sequence lengths
    values = list(cfg.seqlen["values"])  # not .values: that is the DictConfig method
    if not values:
        raise ConfigError("seqlen.values", values, "needs at least one length")
    for value in values:
        _positive("seqlen.values", value)
    per_device = tuple(values) if cfg.seqlen.per_device else None
    frontier = _frontier(cfg.seqlen, values, world if cfg.seqlen.per_device else 1)
    totals = tuple(v * world for v in values) if per_device else tuple(values)

    # bench
    b = cfg.bench
    passes = list(b.passes)
    if not passes or any(x not in PASSES for x in passes):
        raise ConfigError("bench.passes", passes, f"a non-empty list of {', '.join(PASSES)}")
    if b.warmup < 0:
        raise ConfigError("bench.warmup", b.warmup, "must be >= 0")
    _positive("bench.reps", b.reps)
    _positive("bench.mask_samples", b.mask_samples)
    _positive("bench.profile_reps", b.profile_reps)
    _positive("bench.numerics_rows", b.numerics_rows)
    if any(not 0.0 <= q <= 1.0 for q in b.quantiles) or 0.5 not in list(b.quantiles):
        raise ConfigError("bench.quantiles", list(b.quantiles), "values in [0, 1], including 0.5")
    if b.timeout_s <= 0:
        raise ConfigError("bench.timeout_s", b.timeout_s, "must be > 0")
    for key in ("warmup_ms", "rep_ms", "tolerance"):
        value = b[key]
        if value is not None and value <= 0:
            raise ConfigError(f"bench.{key}", value, "must be > 0 (or null)")
    if b.threads is not None:
        _positive("bench.threads", b.threads)
    if b.telemetry not in TELEMETRY_MODES:
        raise ConfigError("bench.telemetry", b.telemetry, f"one of {', '.join(TELEMETRY_MODES)}")
    if b.telemetry_interval_ms is not None and not b.telemetry_interval_ms > 0:
        raise ConfigError(
            "bench.telemetry_interval_ms", b.telemetry_interval_ms, "must be > 0 (or null)"
        )
    if b.memory_budget_gib is not None and not b.memory_budget_gib > 0:
        raise ConfigError("bench.memory_budget_gib", b.memory_budget_gib, "must be > 0 (or null)")

    # mask: parameters valid at every length
    mask_cfg = _container(cfg.mask)
    mask_name = str(mask_cfg.pop("name"))
    seed_override = mask_cfg.pop("seed", None)
    try:
        pattern = get_pattern(mask_name)
    except UnknownNameError as err:
        raise ConfigError("mask", mask_name, str(err)) from err
    if "heads" in mask_cfg and mask_cfg["heads"] is None:
        mask_cfg["heads"] = heads_kv
    for total in totals:
        try:
            _, values_obj = make_params(pattern.name, total, **mask_cfg)
        except ValueError as err:
            raise _mask_error(pattern.name, total, mask_cfg, str(err)) from err
    samples = int(b.mask_samples) if values_obj.randomized() else 1
    mask_seed = int(cfg.seed if seed_override is None else seed_override)

    return Cell(
        kernel=kernel_name,
        kernel_options=kernel_options,
        cp=cp_name,
        cp_options=cp_options,
        mask=pattern.name,
        mask_params=mask_cfg,
        mask_seed=mask_seed,
        mask_samples=samples,
        seqlens=totals,
        seqlen_per_device=per_device,
        heads_q=heads_q,
        heads_kv=heads_kv,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
        nodes=nodes,
        devices_per_node=devices,
        backend=backend,
        bench=BenchConfig(**_container(b)),
        seed=int(cfg.seed),
        config={
            str(k): OmegaConf.to_container(cfg[k], resolve=True)
            if OmegaConf.is_config(cfg[k])
            else cfg[k]
            for k in cfg
            if k != "hydra"  # Hydra's own node is not part of the cell (and not resolvable here)
        },
        job=job or JobInfo(output_dir="."),
        frontier=frontier,
    )


def _mask_error(mask: str, seqlen: int, given: dict[str, Any], message: str) -> ConfigError:
    """One mask parameter's error as ``mask.KEY=VALUE is invalid: RULE (mask M at seqlen S)``.

    Patterns word their checks ``key=value rule``; other messages name the whole set.
    """
    match = re.match(r"(\w+)=(\S+) (.+)$", message)
    if match and match.group(1) in given:
        key = match.group(1)
        return ConfigError(
            f"mask.{key}", given[key], f"{match.group(3)} (mask {mask} at seqlen {seqlen})"
        )
    return ConfigError(f"mask (seqlen {seqlen})", given, message)


def _frontier(seqlen: DictConfig, values: list[int], world: int) -> FrontierSearch | None:
    """The frontier search of ``seqlen=frontier`` (None for a list of lengths)."""
    if not seqlen.get("frontier", False):
        return None
    if len(values) != 1:
        raise ConfigError("seqlen.values", values, "one starting length with seqlen.frontier=true")
    if seqlen.frontier_max < values[0]:
        raise ConfigError(
            "seqlen.frontier_max", seqlen.frontier_max, f"must be >= seqlen.values ({values[0]})"
        )
    if seqlen.frontier_resolution < 2:
        raise ConfigError("seqlen.frontier_resolution", seqlen.frontier_resolution, "must be >= 2")
    return FrontierSearch(int(seqlen.frontier_max) * world, int(seqlen.frontier_resolution))
