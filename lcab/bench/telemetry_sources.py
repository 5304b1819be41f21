"""Where a pass's clocks, power and energy are read: NVML on a GPU, the kernel's files on a CPU.

A GPU is read through NVIDIA's ``pynvml`` (``nvidia-ml-py``), imported only when sampled; a CPU
host through RAPL's package energy counter (``/sys/class/powercap``, root-only on most kernels),
``cpufreq``, or ``/proc/cpuinfo``'s nominal clock in a VM. What cannot be read is None with a
one-line note, never an error. Units: MHz, W, J, °C (NVML reports mW and mJ).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from typing_extensions import override


class TelemetryUnavailableError(RuntimeError):
    """The source cannot be read here (the message says why, in one line)."""


@dataclass(frozen=True)
class Sample:
    """One reading at ``t_s`` (wall clock; in a `TelemetryReading`, since its window opened)."""

    t_s: float
    clock_mhz: float | None
    """The compute clock: a GPU's SM clock, a CPU's median core clock."""
    mem_clock_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    events: int = 0
    """Clock-event (throttle) reason bits, NVML's ``nvmlClocksEventReason*``; 0 on a CPU."""


@dataclass
class WindowBuffer:
    """What a source kept by itself over a window (NVML's sample buffer, violation counters)."""

    samples: list[Sample] = field(default_factory=list)
    event_bits: int = 0
    """Policies whose violation counter advanced in the window, as `VIOLATION_BITS`."""
    notes: list[str] = field(default_factory=list)


class Source(Protocol):
    """One device's readings; every method may raise (the sampler turns that into a note)."""

    kind: str
    """"nvml" or "host"."""
    reads_block: bool
    """Whether a read can hang (a driver call): then it is read on a thread with a timeout."""
    energy_step_s: float
    """How often the energy counter advances (an energy window spans `ENERGY_STEPS` of them)."""

    def open(self) -> None:
        """Get ready (load the library, find the device); raise `TelemetryUnavailableError`."""

    def device_name(self) -> str | None:
        """The name the device reports (NVML's, for the peak table)."""
        return None

    def energy_j(self) -> float | None:
        """A counter of energy spent so far, in joules (None: not exposed, see `energy_note`)."""

    def energy_note(self) -> str | None:
        """Why `energy_j` is None (None when it is not)."""

    def power_limit_w(self) -> float | None:
        """The power limit the device enforces (None: none known)."""
        return None

    def sample(self, t_s: float) -> Sample:
        """The device's clocks, power and temperature now."""

    def event_names(self, bits: int) -> list[str]:
        """The names of the clock-event reasons in ``bits``."""
        return []

    def mark(self) -> object:
        """Where the source's own buffer and counters stand as a window opens (`since`'s key)."""
        return None

    def since(self, mark: object) -> WindowBuffer:
        """What the source kept by itself after ``mark`` (nothing, for a source that keeps none)."""
        return WindowBuffer()


_BUFFERED = (("clock_mhz", 5, 1.0), ("mem_clock_mhz", 6, 1.0), ("power_w", 0, 1e-3))
"""(Sample field, nvmlSamplingType_t, scale to MHz or W): PROCESSOR_CLK 5, MEMORY_CLK 6,
TOTAL_POWER 0 (mW), as nvidia-ml-py 13.615.71's pynvml.py numbers them."""

_VIOLATIONS = ((0, "PowerViolation", 1 << 32), (1, "ThermalViolation", 1 << 33))
"""NVML_PERF_POLICY_POWER 0 and _THERMAL 1, each with a bit above NVML's clock-event reason bits
(highest 0x100), so a window's events travel as one integer, exact in a float64 gather."""


@dataclass(frozen=True)
class _NvmlMark:
    newest_us: dict[int, int]
    violations_ns: dict[int, int]


class NvmlSource(Source):
    """A GPU through ``pynvml``, found by its UUID (as CUDA names it) or else its index."""

    kind = "nvml"
    reads_block = True
    energy_step_s = 0.1
    """The driver's energy counter advances every 20-100 ms (PETSc's PetscLogGpuEnergyMeter
    notes; Zeus v0.6.1): the longest is taken."""

    def __init__(self, index: int, uuid: str | None = None) -> None:
        self.index, self.uuid = index, uuid
        self._nvml: Any = None
        self._handle: Any = None
        self._energy_note: str | None = None
        self._reasons: dict[int, str] = {}
        self._newest_us: dict[int, int] = {}
        """Per sampling type the driver answers, the newest sample's stamp seen (0: none)."""
        self._refused: dict[str, str] = {}
        """What the driver refused ("samples", "violations"): the note, said every window."""

    @override
    def open(self) -> None:
        if self._nvml is not None:
            return  # opened by an earlier pass of this process
        try:
            import pynvml
        except ImportError as err:
            raise TelemetryUnavailableError(f"nvidia-ml-py is not installed ({err})") from err
        try:
            pynvml.nvmlInit()
            handle = None
            if self.uuid:
                name = self.uuid if self.uuid.startswith("GPU-") else f"GPU-{self.uuid}"
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(name)
                except pynvml.NVMLError:
                    handle = None  # a MIG slice or an odd UUID form: fall back on the index
            self._handle = handle or pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except pynvml.NVMLError as err:
            raise TelemetryUnavailableError(f"NVML: {err}") from err
        self._nvml = pynvml
        # the binding's own constants name the reason bits (the deprecated aliases left out)
        for attr in dir(pynvml):
            if attr.startswith("nvmlClocksEventReason") and attr not in (
                "nvmlClocksEventReasonAll",
                "nvmlClocksEventReasonNone",
                "nvmlClocksEventReasonUserDefinedClocks",
            ):
                value = getattr(pynvml, attr)
                if isinstance(value, int) and value:
                    self._reasons[value] = attr.removeprefix("nvmlClocksEventReason")
        for _, name, bit in _VIOLATIONS:
            self._reasons[bit] = name

    @override
    def device_name(self) -> str | None:
        name = self._nvml.nvmlDeviceGetName(self._handle)
        return name.decode() if isinstance(name, bytes) else str(name)

    @override
    def energy_j(self) -> float | None:
        if self._energy_note is not None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3
        except self._nvml.NVMLError as err:  # Volta and later only; some boards refuse it
            self._energy_note = f"NVML energy counter: {err}"
            return None

    @override
    def energy_note(self) -> str | None:
        return self._energy_note

    @override
    def power_limit_w(self) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle)) / 1e3
        except self._nvml.NVMLError:  # a board without power management
            return None

    @override
    def sample(self, t_s: float) -> Sample:
        nvml, handle = self._nvml, self._handle
        return Sample(
            t_s=t_s,
            clock_mhz=float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            mem_clock_mhz=float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
            power_w=float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1e3,
            temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            events=int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
        )

    @override
    def event_names(self, bits: int) -> list[str]:
        return [name for bit, name in sorted(self._reasons.items()) if bits & bit]

    @override
    def mark(self) -> object:
        """The newest stamp of each buffered type and the violation counters."""
        if not self._newest_us and "samples" not in self._refused:
            self._newest_us = dict.fromkeys((kind for _, kind, _ in _BUFFERED), 0)
        for kind in list(self._newest_us):
            self._driver_samples(kind)
        return _NvmlMark(dict(self._newest_us), self._violations())

    @override
    def since(self, mark: object) -> WindowBuffer:
        assert isinstance(mark, _NvmlMark)
        buffer = WindowBuffer()
        for attr, kind, scale in _BUFFERED:
            if kind not in self._newest_us:
                continue
            for stamp_us, value in self._driver_samples(kind):
                # NVML stamps its samples in CPU microseconds: taken as the realtime clock's
                t_s = stamp_us / 1e6
                read: dict[str, float | None] = dict.fromkeys(("clock_mhz", "mem_clock_mhz"))
                read["power_w"] = None
                read[attr] = value * scale
                buffer.samples.append(
                    Sample(t_s, read["clock_mhz"], read["mem_clock_mhz"], read["power_w"], None)
                )
        after = self._violations()
        for policy, _, bit in _VIOLATIONS:
            if policy in after and after[policy] > mark.violations_ns.get(policy, after[policy]):
                buffer.event_bits |= bit
        buffer.notes = list(self._refused.values())
        return buffer

    def _driver_samples(self, kind: int) -> list[tuple[int, float]]:
        """The driver's samples of ``kind`` newer than the last one seen, as (stamp µs, value)."""
        nvml = self._nvml
        try:
            _, samples = nvml.nvmlDeviceGetSamples(self._handle, kind, self._newest_us[kind])
        except nvml.NVMLError_NotFound:
            return []  # nothing sampled since: a window shorter than the driver's period
        except nvml.NVMLError as err:
            self._newest_us.pop(kind, None)
            if not self._newest_us:
                self._refused["samples"] = (
                    f"NVML sample buffer: {err} (clocks and power read at the window's ends only)"
                )
            return []
        read = [(int(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples]
        if read:
            self._newest_us[kind] = max(self._newest_us[kind], max(t for t, _ in read))
        return read

    def _violations(self) -> dict[int, int]:
        """Each policy's violation time so far (ns); a policy the driver refuses is left out."""
        if "violations" in self._refused:
            return {}
        nvml, counters = self._nvml, {}
        for policy, _, _ in _VIOLATIONS:
            try:
                counters[policy] = int(
                    nvml.nvmlDeviceGetViolationStatus(self._handle, policy).violationTime
                )
            except nvml.NVMLError as err:
                if not counters and policy == _VIOLATIONS[-1][0]:
                    self._refused["violations"] = f"NVML violation counters: {err}"
        return counters


class HostSource(Source):
    """A CPU host through the kernel's files (``root`` is ``/``; tests give another tree)."""

    kind = "host"
    reads_block = False
    energy_step_s = 0.001
    """RAPL's energy status counters advance about every millisecond (Intel SDM, vol. 3B)."""

    def __init__(self, root: Path = Path("/"), cores: set[int] | None = None) -> None:
        self.root = root
        self.cores = cores if cores is not None else _affinity()
        self._rapl: list[tuple[Path, float]] = []
        self._last_uj: list[float] = []
        self._wraps: list[float] = []
        self._energy_note: str | None = None
        self._freq_files: list[Path] = []
        self._opened = False
        self._last_mhz: float | None = None
        self._static_mhz: float | None = None

    @override
    def open(self) -> None:
        if self._opened:
            return
        self._opened = True
        powercap = self.root / "sys/class/powercap"
        # package domains only ("intel-rapl:0"): they hold their sub-zones' energy
        zones = sorted(p for p in powercap.glob("intel-rapl:*") if p.name.count(":") == 1)
        for zone in zones:
            try:
                span = float((zone / "max_energy_range_uj").read_text())
                self._last_uj.append(float((zone / "energy_uj").read_text()))
                self._rapl.append((zone / "energy_uj", span))
            except (OSError, ValueError) as err:
                self._energy_note = f"RAPL {zone.name} is not readable ({type(err).__name__})"
                self._rapl, self._last_uj = [], []
                break
        self._wraps = [0.0] * len(self._rapl)
        if not zones:
            self._energy_note = f"no RAPL energy counter ({powercap} has no intel-rapl zone)"
        cpus = self.root / "sys/devices/system/cpu"
        self._freq_files = [
            f
            for core in sorted(self.cores)
            if (f := cpus / f"cpu{core}/cpufreq/scaling_cur_freq").exists()
        ]

    @override
    def energy_j(self) -> float | None:
        if not self._rapl:
            return None
        total = 0.0
        for i, (path, span) in enumerate(self._rapl):
            now = float(path.read_text())
            if now < self._last_uj[i]:  # the counter wrapped at max_energy_range_uj
                self._wraps[i] += span
            self._last_uj[i] = now
            total += now + self._wraps[i]
        return total / 1e6

    @override
    def energy_note(self) -> str | None:
        return self._energy_note

    @override
    def sample(self, t_s: float) -> Sample:
        return Sample(t_s, self._clock_mhz(), None, None, None)

    def _clock_mhz(self) -> float | None:
        """The median clock of this process's cores (cpufreq), else /proc/cpuinfo's figure.

        That is nominal in a VM and costs ~50 us of GIL to parse: once two reads agree it is kept.
        """
        if self._freq_files:
            return statistics.median(float(f.read_text()) / 1e3 for f in self._freq_files)
        if self._static_mhz is not None:
            return self._static_mhz
        try:
            text = (self.root / "proc/cpuinfo").read_text()
        except OSError:
            return None
        mhz = [
            float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")
        ]
        now = statistics.median(mhz) if mhz else None
        if now is not None and now == self._last_mhz:
            self._static_mhz = now
        self._last_mhz = now
        return now


def _affinity() -> set[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))
