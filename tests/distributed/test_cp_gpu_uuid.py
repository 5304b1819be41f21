"""Two NCCL ranks of one host bound to one GPU are refused by UUID, on every rank, after joining.

A task that sees one GPU binds index 0 whether SLURM gave it its own GPU or every task the same
one; only the GPU's UUID tells the two apart. The UUIDs are a seam here (gloo, no GPU): each
rank reports the one it is given, and the context is told it runs NCCL, or left on gloo, where
ranks may share a GPU for a numerics-only check and every rank notes it (``shared_device``).
"""

from __future__ import annotations

from typing import Any

import pytest

from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


def rank_main(
    rank: int, world: int, rendezvous: str, messages: Any, uuids: list[str], backend: str
) -> None:
    import types

    import torch

    from lcab.distributed.context import DistContext

    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(uuid=uuids[rank])
    ctx = DistContext.start_local(rank, world, world, "gloo", rendezvous, 60)
    ctx.device = torch.device("cuda", 0)  # as bound: each task sees "its" GPU 0
    ctx.backend = backend  # the check's rule; the transport stays gloo
    try:
        ctx.check_distinct_gpus()
        messages.put(("verdict", rank, "shared" if ctx.shared_device else "ok"))
    except RuntimeError as err:
        messages.put(("verdict", rank, str(err)))
    ctx.close()


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
