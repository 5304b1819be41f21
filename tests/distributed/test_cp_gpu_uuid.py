"""Two NCCL ranks of one host bound to one GPU are refused by UUID, on every rank, before NCCL.

A task that sees one GPU binds index 0 whether SLURM gave it its own GPU or every task the same
one; only the GPU's UUID tells the two apart. The UUIDs are a seam here (no GPU): each rank
reports the one it is given through the rendezvous store, under NCCL's rule, or gloo's, where
ranks may share a GPU for a numerics-only check and every rank notes it (``shared_device``).

The order matters: ``init_process_group(device_id=...)`` connects NCCL at once, and NCCL's own
"Duplicate GPU" error would come first and say less. The last test goes through lcab's real
join (env:// rendezvous, then ``init_process_group`` on its store) with NCCL's eager check
emulated inside ``init_process_group``: lcab's refusal must be what every rank sees.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


def rank_main(
    rank: int, world: int, rendezvous: str, messages: Any, uuids: list[str], backend: str
) -> None:
    import types
    from datetime import timedelta

    import torch

    from lcab.distributed import context

    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(uuid=uuids[rank])
    store = context.rendezvous_store(f"file://{rendezvous}", rank, world, timedelta(seconds=60))
    try:  # as bound: each task sees "its" GPU 0; the backend is the check's rule
        shared = context.gpu_verdict(store, rank, world, torch.device("cuda", 0), backend)
        messages.put(("verdict", rank, "shared" if shared else "ok"))
    except RuntimeError as err:
        messages.put(("verdict", rank, str(err)))


def verdicts(uuids: list[str], tmp_path: Any, backend: str = "nccl") -> list[str]:
    got: list[tuple[Any, ...]] = []

    def on_message(msg: tuple[Any, ...]) -> float:
        got.append(msg)
        return 60.0

    result = launch(rank_main, len(uuids), (uuids, backend), 60.0, on_message, tmp_path)
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    return [m[2] for m in sorted(got, key=lambda m: m[1])]


def test_own_gpu_per_task_passes_a_shared_one_is_refused_on_every_rank(tmp_path):
    assert verdicts(["GPU-a", "GPU-b", "GPU-c"], tmp_path / "own") == ["ok"] * 3
    shared = verdicts(["GPU-a", "GPU-b", "GPU-a"], tmp_path / "shared")
    assert len(set(shared)) == 1  # the same refusal everywhere: no rank goes on alone
    assert shared[0].startswith("ranks 0 and 2 share GPU GPU-a on ")


def test_gloo_ranks_may_share_a_gpu_and_all_say_so(tmp_path):
    assert verdicts(["GPU-a", "GPU-b"], tmp_path / "own", "gloo") == ["ok"] * 2
    assert verdicts(["GPU-a", "GPU-b", "GPU-a"], tmp_path / "shared", "gloo") == ["shared"] * 3


def nccl_rank(
    rank: int, world: int, rendezvous: str, messages: Any, uuids: list[str], port: int
) -> None:
    """A SLURM task (one visible GPU) joining under NCCL through `DistContext.from_environment`."""
    import os
    import types

    import torch
    import torch.distributed as dist

    from lcab.distributed.context import DistContext

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURM_PROCID=str(rank),
    )  # fmt: skip
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = lambda device: None
    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(uuid=uuids[rank])
    real_init = dist.init_process_group

    def init_process_group(backend: str, **kwargs: Any) -> None:
        """NCCL connects at once and refuses a duplicate GPU; over gloo for the rest."""
        if backend == "nccl" and uuids.count(uuids[rank]) > 1:
            raise RuntimeError("NCCL error: invalid usage: Duplicate GPU detected")
        kwargs.pop("device_id", None)
        real_init(backend="gloo", **kwargs)

    dist.init_process_group = init_process_group
    try:
        context = DistContext.from_environment("nccl", 60, "cuda")
        messages.put(("verdict", rank, f"joined world {context.world}"))
        context.close()
    except RuntimeError as err:
        messages.put(("verdict", rank, str(err)))


def test_the_refusal_comes_before_nccl_starts(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    got: list[tuple[Any, ...]] = []

    def on_message(msg: tuple[Any, ...]) -> float:
        got.append(msg)
        return 60.0

    shared = ["GPU-a", "GPU-b", "GPU-a"]
    result = launch(nccl_rank, 3, (shared, port), 60.0, on_message, tmp_path / "shared")
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    said = [m[2] for m in sorted(got, key=lambda m: m[1])]
    assert all(s.startswith("ranks 0 and 2 share GPU GPU-a on ") for s in said), said
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    got.clear()
    own = ["GPU-a", "GPU-b", "GPU-c"]
    result = launch(nccl_rank, 3, (own, port), 60.0, on_message, tmp_path / "own")
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    assert sorted(m[2] for m in got) == ["joined world 3"] * 3
