"""Hardware profiles: what the planner assumes about compute and links, each number sourced.

A profile (``conf/hardware/<name>.yaml``) gives per kernel the throughput a call reaches and how
it falls for short rows, per link class the bandwidth and latency a rank sees, and each
collective's efficiency; ``sources`` says where every number comes from (a specification, a
paper's figure, a lab tool's fit on named records), so a prediction traces to its assumptions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HARDWARE_DIR = Path(__file__).resolve().parents[2] / "conf" / "hardware"
CPU_PROFILE = "cpu_gloo_local"
"""The profile ``hardware=auto`` gives CPU cells (on this host's cores)."""
GPU_PROFILE = "h100_nvlink_ib"
"""The profile ``hardware=auto`` gives CUDA cells."""


@dataclass(frozen=True)
class KernelRate:
    """Throughput of one kernel: ``tflops · keys / (keys + half_keys)`` plus a fixed call cost."""

    fwd_tflops: float
    """Forward TFLOP/s on long rows (the plateau)."""
    bwd_tflops: float
    """Backward TFLOP/s on long rows."""
    half_keys: float
    """Keys per query row at which a call reaches half the plateau (short documents, thin
    ring steps and small tiles run below it)."""
    call_us: float
    """Fixed cost of one call (launch, setup of the step, LSE merge), microseconds."""
    tile_rows: float = 0.0
    """Query tile height: every run of consecutive query rows (a document, a zigzag chunk) is
    padded to whole tiles, on average (tile_rows - 1) / 2 wasted rows per run; 0: no tiles."""
    bwd_half_keys: float | None = None
    """``half_keys`` of the backward kernel (None: the forward's)."""
    bwd_tile_rows: float | None = None
    """Query tile height of the backward kernel (None: ``tile_rows``)."""
    pack_gqa: bool = False
    """The forward packs the query heads of one KV head into a tile (FlashAttention-3 does on
    varlen input with GQA), so a tile holds ``tile_rows / (q heads per KV head)`` tokens."""
    bwd_q_bytes: float = 0.0
    """Bytes the backward moves per element of the query-sized tensors it is given, outside
    its main kernel, whatever the mask (FlashAttention-3: reads O and dO, zero-fills and reads
    a float32 dQ accumulator, writes dQ — 2 + 2 + 4 + 4 + 2), so a call on many tokens with
    little work to do costs memory time."""
    bwd_kv_bytes: float = 0.0
    """The same per element of the key-sized tensors, with grouped-query heads only
    (FlashAttention-3 accumulates dK and dV of the query heads sharing a KV head in float32:
    zero-fill and read of each, 2 x (4 + 4))."""
    bwd_pad_q_rows: float = 0.0
    """Rows a varlen backward adds to its float32 dQ accumulator per sequence of the call
    (FlashAttention-3: ``total_q + batch * kBlockM``, 64 for head dim 128), each element
    zero-filled and read (8 bytes): many short documents in one call cost memory time."""
    bwd_pad_kv_rows: float = 0.0
    """The same for the float32 dK/dV accumulators with grouped-query heads (``total_k + batch
    * kBlockN``, 128), each element costing ``bwd_kv_bytes``."""

    bwd_block_cols: float = 0.0
    """Key tile width of the backward kernel (FlashAttention-3: kBlockN, 128 for head dim
    128): a varlen backward launches ``ceil(max_seqlen_k / bwd_block_cols) x query heads x
    sequences`` thread blocks, the same number for every sequence."""
    bwd_empty_block_us: float = 0.0
    """Time a launched backward thread block with no work (a sequence shorter than the grid,
    or empty) holds a multiprocessor, microseconds; 0: not costed."""
    position_flops: float = 0.0
    """What one attended position costs per query head besides its ``4 x head_dim`` forward
    products, in FLOPs at the plateau (a CPU kernel's passes over its scores: maximum, exp,
    sum, mask); the plateaus are then the rate of the products alone, so a call runs faster
    per FLOP at a larger head dimension. 0: all of it is products (a GPU kernel's figures,
    fitted at one head dimension)."""
    bwd_position_flops: float | None = None
    """The same beside the backward's ``10 x head_dim`` products (None: the forward's)."""
    diagonal_rows: float = 0.0
    """Query rows per piece of a kernel that computes each piece's whole key segment and masks
    past a band edge afterwards (lcab's `ranges`: 128, its ``tile``): every run of rows on a
    diagonal computes about ``diagonal_rows (diagonal_rows - 1) / 2`` masked positions per
    whole piece (`lcab.plan.areas_diagonal`); 0: not costed (a tiled kernel's diagonal tiles
    are left in its fitted rates)."""

    dense_mask: bool = False
    """The kernel takes any mask but full or causal as a dense bias (PyTorch SDPA's cuDNN and
    efficient backends): it computes every position of the call's rectangle and reads the bias
    for each (`Work.dense_rows`), whatever the mask's area."""
    bias_bytes: float = 0.0
    """Memory traffic per computed position and query head of such a call (the bias read
    again for every head: 2 bytes in bf16, more where tiles reread it), at ``memory_gbps``."""
    bwd_bias_bytes: float | None = None
    """``bias_bytes`` of the backward (None: the forward's)."""

    def saturation_keys(self, bwd: bool) -> float:
        """Keys per row at which the pass reaches half its plateau."""
        return self.bwd_half_keys if bwd and self.bwd_half_keys is not None else self.half_keys

    def tile_tokens(self, bwd: bool, q_per_kv: float) -> float:
        """Query tokens one tile covers in a call whose KV heads each serve ``q_per_kv``."""
        rows = self.bwd_tile_rows if bwd and self.bwd_tile_rows is not None else self.tile_rows
        if self.pack_gqa and not bwd:
            return max(rows / max(q_per_kv, 1.0), 1.0)
        return rows


@dataclass(frozen=True)
class KernelMemory:
    """What a rank running one kernel holds beyond the attention tensors `lcab.plan.memory` counts.

    Fitted per profile from measured frontiers (``launchers/plan_fit.py memory``; 0 where none
    were measured), so it includes lcab's harness around the kernel, not the kernel alone.
    """

    fixed_mib: float = 0.0
    """MiB a rank of a world of one adds whatever the length: its first call's thread pools,
    library scratch and stacks, the harness's buffers."""
    cp_fixed_mib: float | None = None
    """The same for a rank of a context-parallel world, whose kernel may run on fewer threads
    (one per rank on a CPU host) beside its process group; None: ``fixed_mib``."""
    q_bytes: float = 0.0
    """Bytes per element of the query-sized tensor of the rank's largest call (tokens x local
    query heads x head dim): float32 accumulators, saved activations, the harness's layout
    copies — per element, so it carries across head counts and dims."""
    cp_q_bytes: float | None = None
    """The same for a rank of a context-parallel world, which draws only its shard of the
    inputs (a world of one makes the whole tensors and their layout copies); None:
    ``q_bytes``."""
    dense_bytes: float = 0.0
    """Bytes per position of the rank's largest dense-mask call at the peak, beside the biases
    its prepared calls keep (those are counted at the problem's element size: PyTorch SDPA's
    additive bias, `lcab.kernels.sdpa`): the boolean masks a bias is built from, and what the
    kernel holds per position; 0: the kernel takes no dense mask."""


@dataclass(frozen=True)
class Link:
    """Bandwidth and latency one rank sees on a link class."""

    gbps: float
    """GB/s one rank can send (10^9 bytes per second)."""
    latency_us: float
    shared: bool = False
    """True when the ranks of a node share this bandwidth (CPU loopback), not one link each."""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Fraction of this link's rate a communication kind reaches where a source gives one for
    this link; other kinds use the profile's ``efficiency``."""


@dataclass(frozen=True)
class Hardware:
    """A hardware profile (see module docstring)."""

    name: str
    device: str
    """cuda | cpu: which default problem (dtype, heads) the planner uses."""
    kernels: dict[str, KernelRate]
    intra: Link
    inter: Link
    efficiency: dict[str, float]
    """Fraction of link bandwidth each communication kind reaches (p2p, a2a, allgather,
    reduce_scatter)."""
    memory_gib: float
    """Memory per device, for the smallest world that fits."""
    memory_gbps: float
    """Memory bandwidth per device (GB/s): merges and accumulations outside the kernel."""
    gather_efficiency: float = 1.0
    """Fraction of ``memory_gbps`` that reads through an index reach (``torch.gather`` with an
    expanded index: ``Work.gather_bytes``; measured by ``python launchers/plan_copies.py``)."""
    scatter_efficiency: float = 1.0
    """Fraction of ``memory_gbps`` that writes through an index reach (``scatter_`` into a
    zeroed tensor: ``Work.scatter_bytes``; measured by ``python launchers/plan_copies.py``)."""
    matmul_tflops: float | None = None
    """Dense matrix-product rate (TFLOP/s) for work outside attention, such as a harness's
    projection gradients; None: the kernel's forward plateau."""
    multiprocessors: int | None = None
    """Streaming multiprocessors of a device: thread blocks run this many at a time (None: not
    a GPU, no launch grid costed)."""
    compute_slots_per_node: int | None = None
    """Ranks of a node that compute at full speed at once (CPU cores); None: one device each."""
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    borrow: dict[str, str] = field(default_factory=dict)
    """Kernels with no figures of their own that run another entry's code, and that entry
    (PyTorch's ``sdpa_flash`` and ``torch_varlen`` call its FlashAttention-2 kernels: ``fa2``)."""
    default_from: str | None = None
    """The entry whose rate ``default`` copies, named when a kernel falls back to it."""
    kernel_memory: dict[str, KernelMemory] = field(default_factory=dict)
    """Per kernel (or ``default``), what a rank holds besides the attention tensors (the
    memory frontier's model, `lcab.plan.frontier`); none: the tensors alone."""
    memory_margin: float = 0.0
    """Share of every memory budget the planner holds back (its frontier, the smallest world
    that fits), fitted with ``kernel_memory`` so that the model's frontier would have run in
    95 % of the fit's cells (``python launchers/plan_fit.py memory``)."""

    def usable_mib(self, budget_mib: float) -> float:
        """What the planner lets a rank fill of ``budget_mib`` (less `memory_margin`)."""
        return budget_mib * (1 - self.memory_margin)

    def rate(self, kernel: str) -> KernelRate:
        """The kernel's rate, the entry it borrows, or the profile's ``default`` entry.

        Raises:
            ValueError: none exists (names the kernels the profile has).

        """
        if kernel in self.kernels:
            return self.kernels[kernel]
        if self.borrow.get(kernel) in self.kernels:
            return self.kernels[self.borrow[kernel]]
        if "default" in self.kernels:
            return self.kernels["default"]
        raise ValueError(
            f"hardware profile {self.name!r} has no rate for kernel {kernel!r}; "
            f"valid: {', '.join(self.kernels)}"
        )

    def memory(self, kernel: str) -> KernelMemory:
        """The kernel's memory terms, the borrowed entry's, ``default``'s, or none (all 0)."""
        for name in (kernel, self.borrow.get(kernel), "default"):
            if name in self.kernel_memory:
                return self.kernel_memory[name]
        return KernelMemory()

    def rate_origin(self, kernel: str) -> str | None:
        """Whose rate ``kernel`` is costed at, said in words; None when it has its own.

        A planner that gives every kernel one rate misleads (an H100 dry run priced FA4 and
        PyTorch's cuDNN backend alike), so output says which kernels borrow a rate.
        """
        if kernel in self.kernels:
            return None
        entry = self.borrow.get(kernel)
        if entry in self.kernels:
            return f"{kernel} is costed at {entry}'s rate (it runs {entry}'s kernels)"
        if "default" not in self.kernels:
            return None  # rate() refuses it
        whose = f"{self.default_from}'s rate" if self.default_from else "its generic rate"
        return (
            f"{kernel} has no figures in hardware profile {self.name}: costed at the "
            f"profile's default ({whose})"
        )

    def with_values(self, values: dict[str, float]) -> Hardware:
        """A copy with dotted parameters replaced (``kernels.ranges.fwd_tflops``: 3.1, ...).

        Raises:
            KeyError: a key that is not one of `parameter_names` (names the valid ones).

        """
        data, names = self.to_dict(), self.parameter_names()
        for key, value in values.items():
            if key not in names:
                raise KeyError(
                    f"hardware parameter {key!r} does not exist in {self.name!r}; valid: "
                    + ", ".join(names)
                )
            node = data
            *path, last = key.split(".")
            for part in path:
                node = node[part]
            node[last] = value
        return from_dict(data)

    def parameter_names(self) -> list[str]:
        """Dotted names of the profile's numeric parameters (what `with_values` can set).

        A link may also be given its own efficiency for any kind the profile's ``efficiency``
        names (``inter.efficiency.a2a``), whether or not it has one yet.
        """

        def walk(node: Any, prefix: str) -> list[str]:
            if isinstance(node, dict):
                return [n for k, v in node.items() for n in walk(v, f"{prefix}{k}.")]
            numeric = isinstance(node, int | float) and not isinstance(node, bool)
            return [prefix[:-1]] if numeric or node is None else []

        data = self.to_dict()
        for words in ("sources", "borrow", "default_from"):
            data.pop(words, None)
        for link in ("intra", "inter"):
            for kind in self.efficiency:
                data[link]["efficiency"].setdefault(kind, None)
        return walk(data, "")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML-ready)."""
        return dataclasses.asdict(self)


def from_dict(data: dict[str, Any]) -> Hardware:
    """A `Hardware` from plain data (a YAML file or a Hydra node).

    ``conf/hardware/auto.yaml`` (``auto: true``) gives `auto_profile` for its ``device``: the
    CPU profile on this host's cores, or the GPU profile for ``cuda``.
    """
    data = dict(data)
    if is_auto(data):
        return auto_profile(data.get("device"))
    data["kernels"] = {k: KernelRate(**v) for k, v in data["kernels"].items()}
    memory = data.get("kernel_memory") or {}
    data["kernel_memory"] = {k: KernelMemory(**v) for k, v in memory.items()}
    data["intra"] = Link(**data["intra"])
    data["inter"] = Link(**data["inter"])
    known = {f.name for f in dataclasses.fields(Hardware)}
    return Hardware(**{k: v for k, v in data.items() if k in known})


def list_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> Hardware:
    """A shipped profile by name, or a YAML file by path.

    Raises:
        ValueError: unknown name (lists the shipped profiles).

    """
    path = Path(name_or_path)
    if not path.suffix:
        path = HARDWARE_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise ValueError(
            f"hardware={name_or_path!r} is unknown; valid: {', '.join(list_profiles())}"
        )
    data = yaml.safe_load(path.read_text())
    data.pop("defaults", None)
    return from_dict(data)


# ---------------------------------------------------------------------------- hardware=auto
def is_auto(data: dict[str, Any]) -> bool:
    """Whether a profile's plain data asks for ``auto`` (``conf/hardware/auto.yaml``)."""
    return bool(data.get("auto"))


def auto_profile(device: str | None = "cpu") -> Hardware:
    """``hardware=auto``: the profile that matches where a cell on ``device`` runs.

    CUDA: `GPU_PROFILE`. Otherwise `CPU_PROFILE` with this host's cores as its compute slots;
    its rates stay the fitted host's (a probe of the host's speed bought no accuracy: the plan
    guide's "hardware=auto on CPU"); on another host, refit the profile.
    """
    if device == "cuda":
        return load_profile(GPU_PROFILE)
    from lcab.config.fork_map import usable_cores

    base, cores = load_profile(CPU_PROFILE), usable_cores()
    return dataclasses.replace(
        base,
        name=f"{CPU_PROFILE}@auto",
        description=f"{base.description}; on this host's {cores} cores",
        compute_slots_per_node=cores,
    )
