"""The CLI pre-flight refuses more local NCCL ranks than the GPUs this host shows (exit 2).

On main, eight NCCL ranks on a one-GPU host passed the pre-flight and NCCL failed after launch
("Duplicate GPU"). The refusal names both fixes; over gloo the same ranks may share the GPU
(a numerics-only check), so that job passes.
"""

from __future__ import annotations

import pytest
import torch

from lcab.config.preflight import preflight
from lcab.launch.checks import slurm_problems

JOB = [
    "kernel=reference",
    "cp=ring",
    "topology=local8",
    "problem.device=cuda",
    "seqlen.values=[64]",
]


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_eight_nccl_ranks_on_one_gpu_exit_2_naming_the_fixes(one_gpu, capsys):
    assert preflight(JOB, extra=slurm_problems) == 2
    err = capsys.readouterr().err
    assert "8 ranks on one node but only 1 visible GPU" in err
    assert "topology.devices_per_node=1" in err and "topology.backend=gloo" in err


def test_gloo_ranks_may_share_the_gpu(one_gpu, capsys):
    assert preflight([*JOB, "topology.backend=gloo"], extra=slurm_problems) == 0, (
        capsys.readouterr()
    )


def test_one_nccl_rank_per_gpu_passes(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert preflight(JOB, extra=slurm_problems) == 0, capsys.readouterr()
