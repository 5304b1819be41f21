"""Each preset is what its description says: the jobs a sweep preset's header promises are the
jobs it expands to, and the bench guide says the same.

``experiment=cpu_kernels`` was described as every CPU kernel but runs one cell;
``+sweep=cpu_kernels`` had grown to 60 jobs while the README still said 35. The counts here are
Hydra's own expansion (the pre-flight's `job_overrides`), set against the numbers written in
the preset files and the bench guide (`lcab/bench/README.md`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lcab.config import CONF_DIR
from lcab.config.preflight import job_overrides

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml")))
def test_a_sweep_preset_expands_to_the_jobs_its_header_says(preset: str) -> None:
    header = (CONF_DIR / "sweep" / f"{preset}.yaml").read_text()
    promised = re.search(r"= (\d+) jobs", header)
    assert promised, f"conf/sweep/{preset}.yaml does not say how many jobs it is"
    jobs = job_overrides([f"+sweep={preset}"], multirun=True)
    assert len(jobs) == int(promised.group(1))


def test_the_experiment_preset_alone_is_one_cell() -> None:
    assert len(job_overrides(["experiment=cpu_kernels"], multirun=False)) == 1
    header = (CONF_DIR / "experiment" / "cpu_kernels.yaml").read_text()
    assert "One cell on\n# its own" in header


def test_the_bench_guide_counts_the_cpu_kernel_sweep_as_it_expands() -> None:
    guide = " ".join((ROOT / "lcab" / "bench" / "README.md").read_text().split())
    command = r"-m \+sweep=cpu_kernels experiment=cpu_kernels # [^#]*?(\d+) jobs"
    prose = r"The CPU kernel sweep is 5 kernels × 12 masks \((\d+) jobs"
    stated = [re.search(pattern, guide) for pattern in (command, prose)]
    assert all(stated), "the bench guide says how many jobs the CPU kernel sweep is, twice"
    jobs = job_overrides(["+sweep=cpu_kernels", "experiment=cpu_kernels"], multirun=True)
    assert {int(match.group(1)) for match in stated if match} == {len(jobs)}
