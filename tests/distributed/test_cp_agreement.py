"""Ranks agree before anything collective: budget-mode counts and which passes run.

Budget-mode timing derives warm-up and repetition counts from each rank's own clock; a pass
list comes from each rank's own probes. Either, left to each rank, pairs one rank's collective
with another's different one (on NCCL: a hang until its timeout). Here rank 1 is made 20x
slower than rank 0, or unable to run a pass, and every rank must still make the same calls.
"""

from __future__ import annotations

from typing import Any

import pytest

from lcab.distributed.launch import launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def timing_rank(rank: int, world: int, rendezvous: str, messages: Any) -> None:
    import time

    import torch
    import torch.distributed as dist

    from lcab.bench.timing import TimingConfig, measure
    from lcab.cp.comm import broadcast_floats
    from lcab.distributed.context import DistContext

    ctx = DistContext.start_local(rank, world, world, "gloo", rendezvous, 60)
    delay_s = 0.0002 if rank == 0 else 0.004  # rank 1's clock says each call is 20x dearer
    config = TimingConfig(warmup_ms=20.0, rep_ms=40.0, max_reps=500)
    cpu = torch.device("cpu")
    out = {}
    for case, collective, agree in [
        ("alone", False, None),  # no collective inside, so unshared counts cannot hang
        ("agreed", False, broadcast_floats),
        ("collective", True, broadcast_floats),  # as every CP call: would hang unshared
    ]:
        calls = [0]

        def fn(collective: bool = collective, calls: list[int] = calls) -> None:
            calls[0] += 1
            time.sleep(delay_s)
            if collective:
                dist.all_reduce(torch.ones(1))

        barrier = ctx.barrier if agree is not None else None
        timing = measure(fn, config, device=cpu, barrier=barrier, agree=agree)
        out[case] = (calls[0], timing.warmup, timing.reps)
    messages.put(("counts", rank, out))
    ctx.close()


def reasons_rank(rank: int, world: int, rendezvous: str, messages: Any) -> None:
    from lcab.bench.targets import CPTarget
    from lcab.distributed.context import DistContext

    class NodeWithoutPackage:
        """A strategy whose kernel lacks a package on rank 1 only (a node's install)."""

        def not_supported_reasons(self, kernel, problem, mask, world, pass_):
            common = ["heads_q=5 is not divisible by the Ulysses degree 2"] if pass_ == "x" else []
            missing = ["needs package 'flash_attn' (not installed)"] if rank == 1 else []
            return common + (missing if pass_ == "bwd" else [])

    ctx = DistContext.start_local(rank, world, world, "gloo", rendezvous, 60)
    target = object.__new__(CPTarget)  # only the parts `reasons` reads
    target.strategy, target.kernel, target.world = NodeWithoutPackage(), None, world
    got = {p: target.reasons(None, None, p) for p in ("fwd", "bwd", "x")}  # type: ignore[arg-type]
    messages.put(("reasons", rank, got))
    ctx.close()


def run_world(fn: Any, world: int, tmp_path: Any) -> list[tuple[Any, ...]]:
    got: list[tuple[Any, ...]] = []

    def on_message(msg: tuple[Any, ...]) -> float:
        got.append(msg)
        return 120.0

    result = launch(fn, world, (), 120.0, on_message, tmp_path)
    assert result.status == "done", f"{result.status}: {result.reason}\n{result.detail}"
    return sorted(got, key=lambda m: m[1])


def test_budget_mode_counts_are_decided_once_for_every_rank(tmp_path):
    got = run_world(timing_rank, 2, tmp_path)
    assert len(got) == 2
    zero, one = got[0][2], got[1][2]
    # left alone, each rank's clock picks its own counts: the hazard
    assert zero["alone"][2] > 3 * one["alone"][2]
    for case in ("agreed", "collective"):
        calls, warmup, reps = zero[case]
        assert one[case] == zero[case], case  # the same calls on every rank
        assert calls == 1 + warmup + reps
    # rank 0's clock decides: its fast calls give (about) its own counts on every rank
    assert zero["agreed"][2] > 3 * one["alone"][2]


def test_a_pass_runs_only_where_every_rank_can_run_it(tmp_path):
    got = run_world(reasons_rank, 2, tmp_path)
    (_, _, zero), (_, _, one) = got
    assert zero == one  # the same verdict on every rank
    assert zero["fwd"] == []
    assert zero["bwd"] == ["rank 1: needs package 'flash_attn' (not installed)"]
    assert zero["x"] == ["heads_q=5 is not divisible by the Ulysses degree 2"]
