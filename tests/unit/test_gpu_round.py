"""launchers/gpu_round.sh (the GPU round as device calls) and launchers/nvml_windows.py, up to
the point where CUDA is needed: what runs here must run, and each stops there saying so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import emulated_nvml
from tests.helpers.emulated_nvml import nvml_env

ROOT = Path(__file__).resolve().parents[2]
emulated_nvml_dir = emulated_nvml.emulated_nvml_dir


def round_(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    script = cwd / "launchers" / "gpu_round.sh"
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=120)


def test_the_plan_names_each_call_its_carry_and_a_timeout_that_holds_its_steps() -> None:
    done = round_("plan")
    assert done.returncode == 0, done.stderr
    calls = re.findall(r"^(\w+)\s+carries (.+?)\s+timeout_s (\d+)", done.stdout, re.M)
    assert [c[0] for c in calls] == ["fa3", "kernels", "measure", "extra"]  # the order
    blocks = re.split(r"^\w+\s+carries .*$", done.stdout, flags=re.M)[1:]
    for (name, _, timeout), block in zip(calls, blocks, strict=True):
        limits = [int(s) for s in re.findall(r"^    \S+\s+(\d+)s ", block, re.M)]
        assert sum(limits) == int(timeout), name  # stage + every step fit the call's timeout
        assert int(timeout) <= 600, name  # a device command runs at most 10 minutes
    assert "budget: 15 min" in done.stdout


def test_a_call_without_its_house_or_unknown_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "launchers").mkdir()
    shutil.copy(ROOT / "launchers" / "gpu_round.sh", tmp_path / "launchers")
    missing = round_("fa3", str(tmp_path / "out"), cwd=tmp_path)
    assert missing.returncode == 2 and "no .whl/fa3/part-1: carry .whl/fa3" in missing.stderr
    unknown = round_("fa5", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "valid: plan, prepare, fa3 kernels measure extra" in unknown.stderr


def test_nvml_windows_reads_the_counters_and_stops_where_cuda_is_needed(
    tmp_path: Path, emulated_nvml_dir: Path
) -> None:
    """On the emulated driver with its energy counter set to move every 20 ms, the probe finds
    that period (the median of 3 s of polling), writes its rows, and stops before the steps
    that need a GPU load."""
    out = tmp_path / "nvml.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "launchers" / "nvml_windows.py"), str(out)],
        env=nvml_env(emulated_nvml_dir, energy_period_ms=20), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "no CUDA device" in done.stdout
    rows = {row["reading"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"energy_mj", "power_mw"} and not rows["energy_mj"]["loaded"]
    assert rows["energy_mj"]["changes"] > 50  # 3 s / 20 ms = 150, less a busy host's misses
    assert 0.015 <= rows["energy_mj"]["median_s"] <= 0.025
