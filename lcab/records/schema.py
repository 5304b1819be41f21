"""`RunRecord`: one flat, versioned record per (cell, sequence length).

JSONL files of these records are the source of truth; everything else is a view of them. Flat
(one column per figure) so it loads straight into a DataFrame. Times are ms, memory MiB,
throughput TFLOP/s under `lcab.flops.FLOP_CONVENTION`; quantiles with several mask samples are
medians over samples. The fields' meaning: lcab/records/README.md.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from lcab.flops import PASSES

SCHEMA_VERSION = 1

TIMING_FIELDS = (
    *("ms_p50", "ms_p20", "ms_p80", "ms_samples", "ms_reps", "rank_ms_p50", "predicted_ratio"),
    *("tflops", "tflops_dense", "tflops_mean_rank", "peak_share", "peak_implausible"),
    *("energy_j", "energy_j_per_token", "gflops_per_j"),
)
"""`PassResult` fields read off the clock: not a measurement when ranks shared a GPU."""
SETUP_COLUMNS = ("setup_mask_ms", "setup_prepare_ms", "setup_first_call_ms")
"""`RunRecord`'s set-up times: read off the same clock as the passes'."""
TIMING_COLUMNS = (
    *(f"{p}_{f}" for p in PASSES for f in TIMING_FIELDS),
    "phase_ms",
    *SETUP_COLUMNS,
)
"""The `RunRecord.flat` columns read off the clock."""

MAX_KEPT_REPS = 600
"""Timed repetitions a pass keeps: the paper's protocol (20 reps × 30 mask samples) whole."""

STATUSES = ("ok", "skipped", "oom", "error", "timeout", "numerics_mismatch")
#: Severity order used to combine pass statuses into the record status.
_SEVERITY = {"ok": 0, "skipped": 1, "numerics_mismatch": 2, "oom": 3, "timeout": 4, "error": 5}


@dataclass
class PassResult:
    """Everything measured for one pass (fwd, bwd or fwd_bwd) of one (cell, seqlen)."""

    status: str = "skipped"
    reason: str | None = None
    ms_p50: float | None = None
    ms_p20: float | None = None
    ms_p80: float | None = None
    ms_samples: list[float] | None = None
    """Median time of each mask sample (the spread across masks)."""
    ms_reps: list[float] | None = None
    """The timed repetitions (ms), at most `MAX_KEPT_REPS` (evenly thinned beyond)."""
    reps: int | None = None
    flops: int | None = None
    """FLOPs of one call (median over mask samples)."""
    tflops: float | None = None
    """Useful TFLOP/s from the p50 time (median over mask samples); per device under CP."""
    tflops_dense: float | None = None
    """Dense-equivalent TFLOP/s (area = Sq·Sk)."""
    tflops_mean_rank: float | None = None
    """Under CP: global FLOPs / (world × mean rank time)."""
    mem_peak_mib: float | None = None
    """Peak memory of the timed region; under CP the largest over ranks (`mem_peak_rank`)."""
    mem_delta_mib: float | None = None
    """Peak above the region's starting point; under CP the largest of any rank's."""
    mem_reserved_mib: float | None = None
    """CUDA: the caching allocator's reserved peak above its start (max over ranks)."""
    mem_peak_rank: int | None = None
    """Under CP: the rank whose peak is `mem_peak_mib`."""
    max_abs_err: float | None = None
    """Largest error against the fp64 reference (out for fwd; dq/dk/dv for bwd), normalised."""
    errors: dict[str, float] | None = None
    """Per tensor: normalised max error (out, lse, dq, dk, dv)."""
    rank_ms_p50: list[float] | None = None
    """Under CP: each rank's own p50 time (the time split per pass is the record's phase_ms)."""
    backend: str | None = None
    """The library path that ran, when the kernel chooses one at run time (SDPA's backend)."""
    predicted_ms: float | None = None
    """The planner's time for this pass on `RunRecord.predicted_hardware` (fwd_bwd: fwd + bwd)."""
    predicted_tflops: float | None = None
    """The planner's per-device TFLOP/s for this pass."""
    predicted_ratio: float | None = None
    """Measured / predicted throughput (= predicted_ms / ms_p50; above 1: faster than predicted)."""
    # telemetry over the timed repetitions (lcab.bench.telemetry), read beside them
    clock_mhz_min: float | None = None
    """Compute clock while the repetitions ran (GPU SM, CPU core); lowest over samples, ranks."""
    clock_mhz_median: float | None = None
    """... median (of each sample's median; the median over ranks)."""
    clock_mhz_max: float | None = None
    """... highest."""
    clock_samples: int | None = None
    """Clock samples inside the timed window (the fewest of any rank or mask sample)."""
    clock_source: str | None = None
    """"inside the window", or "the window's ends" (no sample fell inside)."""
    mem_clock_mhz: float | None = None
    """GPU memory clock, median."""
    power_w: float | None = None
    """Mean power per device (energy counter over the window, else readings); mean over ranks."""
    power_w_max: float | None = None
    """The highest rank's mean power."""
    energy_j: float | None = None
    """Energy of one call, all of the job's devices together (the energy window's per call)."""
    energy_window_s: float | None = None
    """Untimed calls back to back after the timed ones (at least 1 s); median over samples."""
    energy_calls: int | None = None
    """The calls in the energy window."""
    energy_j_per_token: float | None = None
    """`energy_j` / tokens of the sequence."""
    gflops_per_j: float | None = None
    """Useful GFLOP per joule: the call's FLOPs over `energy_j`."""
    temperature_c: float | None = None
    """Hottest reading of any device."""
    clock_events: list[str] | None = None
    """Clock-event (throttle) reasons NVML reported while the repetitions ran."""
    peak_tflops: float | None = None
    """A GPU's dense peak at the measured clock (`lcab.peaks`), or a CPU host's measured matmul
    rate (`lcab.bench.cpu_peak`); ``peak_basis`` says which."""
    peak_share: float | None = None
    """`tflops` / `peak_tflops`."""
    peak_implausible: bool | None = None
    """Above 100 % of a GPU's peak, 150 % of a CPU's matmul rate: a FLOP count or timer is wrong."""


@dataclass
class RunRecord:
    """One (cell, seqlen) result. Field order is the CSV column order."""

    # identity
    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    sweep_id: str = ""
    job_num: int | None = None
    override_dirname: str = ""
    created_at: str = ""
    lcab_version: str = ""
    git_sha: str | None = None
    git_dirty: bool | None = None
    # axes
    kernel: str = ""
    cp: str = "none"
    mask: str = ""
    seqlen: int = 0
    seqlen_per_device: int | None = None
    world_size: int = 1
    nodes: int = 1
    devices_per_node: int = 1
    heads_q: int = 0
    heads_kv: int = 0
    head_dim: int = 0
    dtype: str = ""
    device: str = ""
    passes: list[str] = field(default_factory=list)
    # status
    status: str = "skipped"
    reasons: list[str] = field(default_factory=list)
    error_type: str | None = None
    error_msg: str | None = None
    # mask
    mask_params: dict[str, Any] = field(default_factory=dict)
    mask_seed: int | None = None
    mask_samples: int = 1
    mask_area: int | None = None
    mask_density: float | None = None
    num_docs: int | None = None
    doc_lengths: list[int] | None = None
    """Document lengths of the first mask sample (None above 512 documents: see the digest)."""
    doc_lengths_digest: str | None = None
    """sha256 of the first sample's document lengths (replay: mask name, params and seed)."""
    # measurements per pass
    fwd: PassResult = field(default_factory=PassResult)
    bwd: PassResult = field(default_factory=PassResult)
    fwd_bwd: PassResult = field(default_factory=PassResult)
    flop_convention: str = ""
    numerics_mode: str | None = None
    """'full' (whole fp64 reference), 'sampled' (fp64 reference on sampled query rows) or None."""
    numerics_tolerance: float | None = None
    # setup (not part of the kernel time)
    setup_mask_ms: float | None = None
    setup_prepare_ms: float | None = None
    setup_first_call_ms: float | None = None
    # context parallelism
    cp_params: dict[str, Any] = field(default_factory=dict)
    comm_bytes_measured: int | None = None
    """Bytes this rank sent in one forward+backward (max over ranks)."""
    comm_bytes_analytic: int | None = None
    comm_bytes_by_op: dict[str, list[int]] | None = None
    """Per operation: [measured, analytic] bytes of one forward(+backward) call."""
    phase_ms: dict[str, float] | None = None
    """One untimed call per pass, split on the slowest rank: ``<pass>_total``, ``_compute``,
    ``_comm`` (collectives, incl. waiting for peers), ``_wait`` (on posted P2P), ``_other``."""
    balance_imbalance: float | None = None
    """max / mean attended area over ranks, from the plan."""
    padding_tokens: int | None = None
    kv_replication: int | None = None
    shared_device: bool = False
    """Under CP over gloo: ranks shared a GPU; the times are not a measurement."""
    # the memory frontier (seqlen=frontier, lcab.bench.frontier)
    frontier_tokens: int | None = None
    """The longest total length that ran without running out of memory (the record's seqlen)."""
    frontier_tokens_per_device: int | None = None
    frontier_bracket: list[int | None] | None = None
    """[longest that ran, shortest that ran out of memory] (None: none such)."""
    frontier_probes: list[dict[str, Any]] | None = None
    """Every probe: ``seqlen``, ``status``, ``mem_peak_mib``, ``mem_delta_mib``, ``reason``."""
    frontier_peak_mib: float | None = None
    """Peak memory at the frontier (the largest over passes and ranks)."""
    frontier_bytes_per_token: float | None = None
    """Largest ``mem_delta_mib`` over passes per token a device holds."""
    frontier_budget_gib: float | None = None
    """``bench.memory_budget_gib`` the search ran under (None: the job's own limits)."""
    frontier_predicted_tokens: int | None = None
    """The planner's frontier for the cell in the same budget (`lcab.plan.frontier`)."""
    frontier_predicted_budget_gib: float | None = None
    """The budget per rank the planner's frontier was searched in (before its margin)."""
    frontier_budget_limit: str | None = None
    """Which limit gave it: ``bench.memory_budget_gib``, the cgroup, MemAvailable, a GPU's free
    memory, or the profile's ``memory_gib``."""
    frontier_predicted_ratio: float | None = None
    """Measured / predicted frontier (below 1: the model leaves out memory the run used)."""
    # the planner's prediction (lcab.plan.record_prediction)
    predicted_hardware: str | None = None
    """The hardware profile the per-pass ``predicted_*`` fields were computed on."""
    prediction_note: str | None = None
    """Why the record has no prediction (no model for the cell, a profile that failed)."""
    prediction_warning: str | None = None
    """Set when a pass's measured / predicted throughput is outside [0.5, 2]."""
    # environment
    torch_version: str = ""
    cuda_version: str | None = None
    nccl_version: str | None = None
    """NCCL that torch was built with (None without NCCL, e.g. a CPU build)."""
    nccl_version_loaded: str | None = None
    """NCCL the process actually loaded (``ncclGetVersion``; None when none is loaded)."""
    device_name: str = ""
    num_threads: int | None = None
    hostname: str = ""
    host_load_start: float | None = None
    """1-minute load average of the host when this length began (`lcab.bench.host_load`)."""
    host_load_end: float | None = None
    """... and when it ended (the benchmark's own work included)."""
    host_cores: int | None = None
    """Cores the benchmark process could run on."""
    host_steal_share: float | None = None
    """Share of CPU time a hypervisor gave other guests while the length ran."""
    python_version: str = ""
    telemetry_source: str | None = None
    """Where the passes' clocks, power and energy were read: nvml, host, or None (off)."""
    telemetry_device: str | None = None
    """The device's name as the telemetry source reports it (NVML; the peak table's key)."""
    telemetry_power_limit_w: float | None = None
    """Rank 0's device's enforced power limit (NVML), W: a capped card runs slower."""
    telemetry_note: str | None = None
    """What the telemetry could not read here, and why (one line per cause)."""
    peak_basis: str | None = None
    """What the passes' ``peak_tflops`` is, and whether the host was busy."""
    slurm_job_id: str | None = None
    slurm_nodelist: str | None = None
    """The job's nodes as SLURM writes them (``n[1-2]``); None outside SLURM."""
    slurm_tasks: int | None = None
    """Tasks (ranks) of the SLURM job."""
    rank_hosts: list[str] | None = None
    """Host of each rank (rank order), as the ranks themselves reported it."""
    # provenance a comparison of campaigns names (lcab.bench.environment, lcab.report.compare)
    torch_build: str | None = None
    """The commit torch was built from (``torch.version.git_version``)."""
    cudnn_version: str | None = None
    driver_version: str | None = None
    """The NVIDIA driver (kernel module) version; None without one."""
    kernel_package_version: str | None = None
    """The distribution(s) providing the kernel's package, with versions (None: torch's own)."""
    kernel_binary: dict[str, str] | None = None
    """sha256 (16 hex digits) of each shared object of that distribution loaded, by file name."""
    # the fully resolved config
    config: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ helpers
    def pass_result(self, name: str) -> PassResult:
        """The `PassResult` of pass ``name`` (fwd, bwd or fwd_bwd)."""
        return getattr(self, name)

    def finalise_status(self) -> None:
        """Set ``status`` from the requested passes: ok if any ran and none failed."""
        statuses = [self.pass_result(p).status for p in self.passes] or ["skipped"]
        if self.status in ("error", "timeout", "oom") and not any(s == "ok" for s in statuses):
            return  # a cell-level failure already decided it
        failures = [s for s in statuses if _SEVERITY[s] >= _SEVERITY["numerics_mismatch"]]
        if failures:
            self.status = max(failures, key=_SEVERITY.__getitem__)
        elif "ok" in statuses:
            self.status = "ok"
        else:
            self.status = "skipped"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (pass results nested under their pass name)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """One JSON line."""
        return json.dumps(self.to_dict(), sort_keys=False, default=_json_default)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Rebuild a record; refuses unknown schema versions instead of misreading them.

        Raises ValueError: missing or unsupported ``schema_version``.
        """
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"record schema_version={version!r} is not supported (this lcab reads "
                f"{SCHEMA_VERSION}); convert it or use the lcab version that wrote it"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        for name in PASSES:
            if isinstance(kwargs.get(name), dict):
                kwargs[name] = PassResult(**kwargs[name])
        return cls(**kwargs)

    @property
    def timings_measured(self) -> bool:
        """Whether the times are a measurement (not when ranks shared a GPU)."""
        return not self.shared_device

    def measured_flat(self) -> dict[str, Any]:
        """`flat`, with the `TIMING_COLUMNS` None unless the times are a measurement."""
        out = self.flat()
        if not self.timings_measured:
            out.update(dict.fromkeys(TIMING_COLUMNS))
        return out

    def flat(self) -> dict[str, Any]:
        """One-level dict for tables: pass fields become ``<pass>_<field>``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, PassResult):
                for pf in dataclasses.fields(value):
                    out[f"{f.name}_{pf.name}"] = getattr(value, pf.name)
            else:
                out[f.name] = value
        return out


def _json_default(value: Any) -> Any:
    """Encode numpy scalars/arrays and other simple objects."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


BUSY_LOAD = 0.5
"""Load average per usable core, before a length began, above which the host was busy."""
BUSY_STEAL = 0.05
"""Share of CPU time stolen by the hypervisor above which the host was shared."""


def busy_host(record: RunRecord) -> str:
    """``; the host was busy: ...`` when its load before the length or steal explains a CPU time."""
    cores, load, steal = record.host_cores or 0, record.host_load_start, record.host_steal_share
    why = []
    if record.device == "cpu" and load is not None and cores and load / cores >= BUSY_LOAD:
        why.append(f"load average {load:.2f} on {cores} cores when the length began")
    if steal is not None and steal >= BUSY_STEAL:
        why.append(f"{steal:.0%} of CPU time stolen by the hypervisor")
    return f"; the host was busy: {', '.join(why)}" if why else ""
