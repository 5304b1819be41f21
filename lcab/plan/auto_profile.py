"""``hardware=auto``: the profile that matches where a cell runs.

For a CUDA cell, the GPU profile (``h100_nvlink_ib``: no probe can stand in for a GPU cluster's
links). For a CPU cell, the CPU profile scaled to this host by `lcab.plan.host_probe`: each
term of the profile multiplied by this host's probe figure over the one the profile's own host
gave (``host_probe`` in ``conf/hardware/cpu_gloo_local.yaml``) —

* kernel plateaus (forward and backward) and ``matmul_tflops``: attention GFLOP/s;
* ``memory_gbps``: copy GB/s;
* the links' ``gbps``: loopback TCP GB/s.

Saturation lengths, latencies and efficiencies are shapes, not speeds, and stay as fitted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from lcab.plan.hardware import HARDWARE_DIR, Hardware, load_profile
from lcab.plan.host_probe import CPU_PROFILE, HostFigures, host_figures

GPU_PROFILE = "h100_nvlink_ib"
"""The profile ``auto`` gives CUDA cells."""

AUTO_NAME = "auto"


def is_auto(data: dict[str, Any]) -> bool:
    """Whether a profile's plain data asks for ``auto`` (``conf/hardware/auto.yaml``)."""
    return bool(data.get("auto")) or data.get("name") == AUTO_NAME


def reference_figures(profile: str = CPU_PROFILE) -> HostFigures:
    """The probe figures of the host ``profile`` was fitted on (its ``host_probe`` section).

    Raises:
        ValueError: the profile has no ``host_probe`` section.

    """
    data = yaml.safe_load((HARDWARE_DIR / f"{profile}.yaml").read_text())
    section = data.get("host_probe")
    if not isinstance(section, dict):
        raise ValueError(f"hardware profile {profile!r} has no host_probe section to scale by")
    names = {f.name for f in dataclasses.fields(HostFigures)}
    return HostFigures(**{k: float(v) for k, v in section.items() if k in names})


def factors(here: HostFigures, ref: HostFigures) -> dict[str, float]:
    """Per probe figure: the figure ``here`` over the reference host's."""
    return {f.name: getattr(here, f.name) / getattr(ref, f.name) for f in dataclasses.fields(here)}


def scaled_cpu_profile(here: HostFigures, profile: str = CPU_PROFILE) -> Hardware:
    """``profile`` scaled to a host with probe figures ``here`` (see module docstring)."""
    base = load_profile(profile)
    scale = factors(here, reference_figures(profile))
    compute, memory, link = (
        scale["attention_gflops"],
        scale["memory_gbps"],
        scale["loopback_gbps"],
    )
    values: dict[str, float] = {"memory_gbps": base.memory_gbps * memory}
    for name, rate in base.kernels.items():
        values[f"kernels.{name}.fwd_tflops"] = rate.fwd_tflops * compute
        values[f"kernels.{name}.bwd_tflops"] = rate.bwd_tflops * compute
    if base.matmul_tflops is not None:
        values["matmul_tflops"] = base.matmul_tflops * compute
    for which in ("intra", "inter"):
        values[f"{which}.gbps"] = getattr(base, which).gbps * link
    scaled = base.with_values(values)
    note = f"compute x{compute:.2f}, memory x{memory:.2f}, links x{link:.2f}"
    return dataclasses.replace(
        scaled,
        name=f"{profile}@auto",
        description=f"{base.description}; scaled to this host by its probe ({note})",
        sources={**base.sources, "auto": f"python -m lcab.plan.host_probe: {note}"},
    )


def auto_profile(device: str | None = "cpu", fresh: bool = False) -> Hardware:
    """The profile for a cell on ``device`` (cuda: the GPU profile; else this host's CPU one)."""
    if device == "cuda":
        return load_profile(GPU_PROFILE)
    return scaled_cpu_profile(host_figures(fresh=fresh))
