"""What a job may really use: its memory cgroup's limit, the host's, a GPU's free memory.

The limit is read as the kernel lays it out: a v1 hierarchy (``memory.limit_in_bytes`` along
the cgroup's ancestors), a v2 one (``memory.max``, ``max`` for none), a container whose
namespace mounts its own cgroup at the root — in folders written here, and in a real memory
cgroup the test makes (`tests.helpers.memory_cgroup`). A GPU's free memory comes through
NVIDIA's own ``pynvml`` on the emulated driver library (`tests.helpers.emulated_nvml`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lcab.bench.job_memory import cgroup_room, oom_kills
from tests.helpers import emulated_nvml
from tests.helpers.emulated_nvml import run_with_nvml
from tests.helpers.memory_cgroup import memory_cgroup

emulated_nvml_dir = emulated_nvml.emulated_nvml_dir
GIB = 1 << 30


def _tree(root: Path, files: dict[str, str], proc_line: str) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = root / "proc-self-cgroup"
    proc.write_text(f"9:name=systemd:/\n{proc_line}\n")
    return proc


def test_v1_takes_the_smallest_limit_along_the_ancestors_and_its_oom_kill_count(tmp_path):
    unlimited = "9223372036854771712"  # v1's "no limit"
    proc = _tree(
        tmp_path,
        {
            "memory/memory.limit_in_bytes": unlimited,
            "memory/slurm/memory.limit_in_bytes": str(2 * GIB),  # the job's
            "memory/slurm/memory.usage_in_bytes": str(GIB // 2),
            "memory/slurm/memory.stat": "cache 1\ntotal_inactive_file 268435456\n",
            "memory/slurm/step_0/memory.limit_in_bytes": unlimited,
            "memory/slurm/step_0/memory.oom_control": "under_oom 0\noom_kill 3\n",
        },
        "4:cpu,memory:/slurm/step_0",
    )
    assert cgroup_room(proc, tmp_path) == (  # holds 0.5 GiB, 0.25 of it reclaimable cache
        2 * GIB,
        tmp_path / "memory/slurm/memory.limit_in_bytes",
        GIB // 4,
    )
    assert oom_kills(proc, tmp_path) == 3


def test_v2_reads_memory_max_and_memory_events(tmp_path):
    proc = _tree(
        tmp_path,
        {
            "cgroup.controllers": "cpuset cpu io memory pids\n",
            "job/memory.max": str(3 * GIB),
            "job/memory.current": str(GIB),
            "job/memory.stat": "anon 1\ninactive_file 1073741824\n",  # all of it cache
            "job/task/memory.max": "max",
            "job/task/memory.events": "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n",
        },
        "0::/job/task",
    )
    assert cgroup_room(proc, tmp_path) == (3 * GIB, tmp_path / "job/memory.max", 0)
    assert oom_kills(proc, tmp_path) == 1


def test_a_container_s_own_cgroup_at_the_mount_s_root_is_read_there(tmp_path):
    proc = _tree(
        tmp_path,
        {"cgroup.controllers": "memory\n", "memory.max": str(GIB)},
        "0::/docker/0123abcd",  # the host's path; the container's mount shows its own group
    )
    assert cgroup_room(proc, tmp_path) == (GIB, tmp_path / "memory.max", 0)  # no usage file


def test_no_limit_anywhere_is_none(tmp_path):
    proc = _tree(tmp_path, {"cgroup.controllers": "memory\n", "a/memory.max": "max"}, "0::/a")
    assert cgroup_room(proc, tmp_path) is None


BUDGET = "import json; from lcab.bench.job_memory import job_budget; print(json.dumps([{}]))"


def test_a_job_in_a_memory_cgroup_may_use_its_limit_less_what_it_holds_shared_by_its_ranks():
    # the process already in the cgroup (lcab.main, in a job) holds 0.25 GiB the ranks never get
    held = "held = bytearray(1 << 28); "
    code = held + BUDGET.format('job_budget("cpu", 1), job_budget("cpu", 3)')
    with memory_cgroup(int(0.75 * GIB)) as inside:
        done = subprocess.run(
            [*inside, sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr[-2000:]
    (one, one_source), (three, three_source) = json.loads(done.stdout)
    # 0.75 - 0.25 - the interpreter and lcab.bench's imports (tens of MiB)
    assert 0.35 < one < 0.5 and three == pytest.approx(one / 3)
    assert "memory cgroup" in one_source and "less the 0.2" in one_source
    assert "memory.limit_in_bytes" in one_source or "memory.max" in one_source
    assert three_source.endswith("/ 3 rank(s)")


def test_a_gpu_job_may_use_the_free_memory_of_its_gpus(emulated_nvml_dir: Path):
    # the emulated driver: device 0 81,559 MiB with 1 GiB used, device 1 143,771 MiB, 3 used
    free0, free1 = 81559 * 2**20 - GIB, 143771 * 2**20 - 3 * GIB
    code = BUDGET.format('job_budget("cuda", 1), job_budget("cuda", 2), job_budget("cuda", 4)')
    done = run_with_nvml(emulated_nvml_dir, code)
    assert done.returncode == 0, done.stderr[-2000:]
    one, two, four = json.loads(done.stdout)
    assert one[0] == pytest.approx(free0 / GIB) and "GPU's free memory" in one[1]
    assert two[0] == pytest.approx(min(free0, free1) / GIB)  # the one with less room
    assert four[0] == pytest.approx(free0 / 2 / GIB) and four[1].endswith("/ 2 rank(s)")
    device1 = "GPU-00000000-1111-2222-3333-555555555555"
    only1 = f"import os; os.environ['CUDA_VISIBLE_DEVICES'] = '{device1}'; "
    done = run_with_nvml(emulated_nvml_dir, only1 + BUDGET.format('job_budget("cuda", 1)'))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)[0][0] == pytest.approx(free1 / GIB)


def test_a_numerics_check_in_a_memory_cgroup_is_sized_by_its_room_not_the_host_s():
    # the check runs beside the kernel's tensors (here 0.25 GiB): half of what is left of 0.75
    code = (
        "held = bytearray(1 << 28); import torch; from lcab.bench.numerics import memory_budget;"
        " print(memory_budget(torch.device('cpu')))"
    )
    with memory_cgroup(int(0.75 * GIB)) as inside:
        done = subprocess.run(
            [*inside, sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert 0 < int(done.stdout) < (0.75 - 0.25) / 2 * GIB  # less torch's own pages too
