"""GPU binding rules: NCCL ranks never share a GPU, gloo ranks may (numerics only).

`binding_problem(8, 1)` used to be None: eight local NCCL ranks on the one GPU a host shows
passed the check and NCCL failed later with "Duplicate GPU". A SLURM task that sees only its own
GPU (``--gpus-per-task=1``) is still fine. Also: host staging modes, the shared-GPU test on UUIDs
and the NCCL high-priority stream options.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from lcab.distributed import staging
from lcab.distributed.context import DistContext, binding_problem, pg_options, shared_gpu


def test_eight_nccl_ranks_on_one_visible_gpu_are_refused_with_both_fixes():
    why = binding_problem(8, 1)
    assert why is not None
    assert "8 ranks on one node but only 1 visible GPU" in why and "NCCL" in why
    assert "topology.devices_per_node=1" in why  # fix 1: fewer ranks
    assert "topology.backend=gloo" in why  # fix 2: a numerics-only check


@pytest.mark.parametrize(
    ("ranks", "visible", "backend", "per_task", "refused"),
    [
        (8, 8, "nccl", False, False),  # one GPU each, all visible
        (8, 4, "nccl", False, True),
        (2, 1, "nccl", False, True),
        (1, 1, "nccl", False, False),
        (8, 1, "nccl", True, False),  # SLURM --gpus-per-task=1: each task its own GPU
        (8, 4, "nccl", True, True),  # a task sees 4 GPUs but 8 ranks share the node
        (8, 1, "gloo", False, False),  # gloo: ranks may share the GPU
    ],
)
def test_binding_rules(ranks, visible, backend, per_task, refused):
    assert (binding_problem(ranks, visible, backend, per_task) is not None) == refused


def test_no_gpu_is_refused_for_every_backend():
    for backend in ("nccl", "gloo"):
        assert "no GPU is visible" in str(binding_problem(2, 0, backend))


def test_shared_gpu_finds_two_ranks_on_one_uuid_of_one_host():
    assert shared_gpu([("a", "u0"), ("a", "u1"), ("b", "u0")]) is None  # same UUID, two hosts
    assert shared_gpu([("a", "u0"), ("a", "u1"), ("a", "u1")]) == (1, 2, "a", "u1")


def test_staging_mode_follows_device_and_backend_unless_forced():
    assert staging.choose_mode("cuda", "gloo", {}) == "p2p"
    assert staging.choose_mode("cuda", "nccl", {}) == "off"
    assert staging.choose_mode("cpu", "gloo", {}) == "off"
    assert staging.choose_mode("cpu", "gloo", {staging.STAGING_ENV: "all"}) == "all"
    assert staging.choose_mode("cuda", "gloo", {staging.STAGING_ENV: "auto"}) == "p2p"
    with pytest.raises(ValueError, match="LCAB_CP_HOST_STAGING='sometimes'"):
        staging.choose_mode("cpu", "gloo", {staging.STAGING_ENV: "sometimes"})


@pytest.mark.parametrize(
    ("device", "backend", "forced", "valid"),
    [
        ("cuda", "gloo", "off", "auto, p2p, all"),  # gloo's send would read a GPU pointer
        ("cuda", "nccl", "p2p", "auto, off"),  # NCCL would be handed host copies
        ("cuda", "nccl", "all", "auto, off"),
    ],
)
def test_a_forced_mode_that_cannot_carry_the_tensors_is_one_clear_line(
    device, backend, forced, valid
):
    with pytest.raises(ValueError) as refused:
        staging.choose_mode(device, backend, {staging.STAGING_ENV: forced})
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"LCAB_CP_HOST_STAGING={forced!r} cannot carry {device} tensors over")
    assert line.endswith(f"valid here: {valid}")


def test_a_bad_forced_mode_is_refused_before_the_rank_joins(monkeypatch, tmp_path):
    monkeypatch.setenv(staging.STAGING_ENV, "p2p")
    with pytest.raises(ValueError, match="valid here: auto, off"):
        DistContext.start_local(0, 2, 2, "nccl", str(tmp_path / "rdv"), 5, "cuda")
    assert not (tmp_path / "rdv").exists()  # no rendezvous was attempted


class _FakeOptions:
    def __init__(self, is_high_priority_stream: bool = False) -> None:
        self.is_high_priority_stream = is_high_priority_stream


def test_high_priority_asks_nccl_for_high_priority_streams(monkeypatch):
    monkeypatch.setattr(
        dist, "ProcessGroupNCCL", SimpleNamespace(Options=_FakeOptions), raising=False
    )
    options = pg_options("nccl", True)["pg_options"]
    assert isinstance(options, _FakeOptions) and options.is_high_priority_stream is True
    assert pg_options("nccl", False) == {}
    assert pg_options("gloo", True) == {}  # gloo has no stream priority


def test_every_group_of_a_high_priority_context_gets_the_options(monkeypatch):
    monkeypatch.setattr(
        dist, "ProcessGroupNCCL", SimpleNamespace(Options=_FakeOptions), raising=False
    )
    calls = []
    monkeypatch.setattr(
        dist, "new_group", lambda ranks, **kw: calls.append((ranks, kw)) or object()
    )
    context = DistContext(0, 4, 4, "nccl", high_priority=True)
    context.group([0, 1])
    context.group([2, 3], tag="dkv")
    assert [ranks for ranks, _ in calls] == [[0, 1], [2, 3]]
    assert all(kw["pg_options"].is_high_priority_stream for _, kw in calls)
    assert calls[0][1]["pg_options"] is not calls[1][1]["pg_options"]


class _JoinedError(Exception):
    pass


@pytest.mark.parametrize("asked", [True, False])
def test_config_option_reaches_init_process_group(compose, tmp_path, monkeypatch, asked):
    """``topology.nccl_high_priority`` → the ``pg_options`` a rank joins its world with."""
    from lcab.bench.targets import make_target
    from lcab.cell import JobInfo
    from lcab.config import resolve_cell

    monkeypatch.setattr(
        dist, "ProcessGroupNCCL", SimpleNamespace(Options=_FakeOptions), raising=False
    )
    seen = {}

    def join(**kwargs):
        seen.update(kwargs)
        raise _JoinedError

    monkeypatch.setattr(dist, "init_process_group", join)
    cfg = compose(
        [
            "kernel=ranges",
            "cp=ring",
            "topology=local2",
            "topology.backend=nccl",
            f"topology.nccl_high_priority={str(asked).lower()}",
            "problem.device=cpu",
        ]
    )
    cell = resolve_cell(cfg, JobInfo(output_dir=str(tmp_path), run_id="h-0", sweep_id="h"))
    with pytest.raises(_JoinedError):
        make_target(cell, 0, str(tmp_path / "rendezvous"))
    assert seen["backend"] == "nccl"
    if asked:
        assert seen["pg_options"].is_high_priority_stream is True
    else:
        assert "pg_options" not in seen
