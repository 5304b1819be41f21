"""Fitting the kernels' memory terms: planted terms come back from the frontiers they make.

The frontier records are made by the model itself with planted terms (each bracket the
model's own search at that budget), written as JSONL and read through
``python launchers/plan_fit.py memory``: the fit must find the planted terms again, and the
fitted model the planted frontiers (``python -m lcab.plan --check-memory``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lcab.plan.cli import run
from lcab.plan.frontier import check_memory, frontier_points, predict_frontier, within
from lcab.plan.hardware import Hardware, KernelMemory, load_profile
from lcab.plan.predict import PlanCell
from lcab.records.schema import RunRecord
from lcab.records.sinks import read_records
from plan_fit import SAFE_SHARE, fit_memory, main

DATA = Path(__file__).resolve().parents[2] / "notebooks" / "data"

PLANTED = {
    "ranges": KernelMemory(fixed_mib=110.0, q_bytes=36.0, cp_fixed_mib=60.0, cp_q_bytes=20.0),
    "sdpa": KernelMemory(
        fixed_mib=90.0, q_bytes=8.0, dense_bytes=9.0, cp_fixed_mib=120.0, cp_q_bytes=12.0
    ),
}


def _planted() -> Hardware:
    planted = dataclasses.replace(load_profile("cpu_gloo_local"), kernel_memory=PLANTED)
    return dataclasses.replace(planted, memory_margin=0.0)  # the brackets the terms alone make


def _record(kernel: str, cp: str, mask: str, budget_gib: float, world: int) -> RunRecord:
    """The record a frontier search of the planted model would write."""
    start = 1024 * world
    cell = PlanCell(cp, kernel, mask, start, 1, world, 8, 2, 64, "float32")
    found = predict_frontier(cell, budget_gib * 1024, True, 1 << 20, 16, _planted())
    assert found.tokens is not None and found.bracket[1] is not None
    return RunRecord(
        kernel=kernel,
        cp=cp,
        mask=mask,
        seqlen=found.tokens,
        world_size=world,
        nodes=1,
        devices_per_node=world,
        heads_q=8,
        heads_kv=2,
        head_dim=64,
        dtype="float32",
        device="cpu",
        status="ok",
        passes=["fwd", "bwd"],
        config={"seqlen": {"frontier_max": 1 << 20, "frontier_resolution": 16}},
        frontier_tokens=found.tokens,
        frontier_bracket=list(found.bracket),
        frontier_budget_gib=budget_gib,
        frontier_probes=[{"seqlen": start, "status": "ok"}],
    )


def _records() -> list[RunRecord]:
    single = [
        _record(kernel, "none", mask, budget, 1)
        for kernel in PLANTED
        for mask in ("causal", "causal_document")
        for budget in (0.3, 0.4, 0.6)
    ]
    parallel = [
        _record(kernel, cp, "causal", budget, 4)
        for kernel in PLANTED
        for cp in ("ulysses", "ring")
        for budget in (0.3, 0.6)
    ]
    return single + parallel


def test_the_fit_finds_the_planted_terms_again() -> None:
    fit = fit_memory(frontier_points(_records()), load_profile("cpu_gloo_local"))
    assert fit.points == "12 single-device and 8 context-parallel frontiers"
    for kernel, planted in PLANTED.items():
        found = fit.hardware.memory(kernel)
        # the brackets are 1/16 wide: the middle is off by up to 1/32 of a length
        assert found.fixed_mib == pytest.approx(planted.fixed_mib, abs=15.0)
        assert found.q_bytes == pytest.approx(planted.q_bytes, rel=0.2, abs=2.0)
        assert found.dense_bytes == pytest.approx(planted.dense_bytes, rel=0.2, abs=0.5)
        assert found.cp_fixed_mib == pytest.approx(planted.cp_fixed_mib, abs=20.0)
        assert found.cp_q_bytes == pytest.approx(planted.cp_q_bytes, rel=0.25)
    assert fit.hardware.memory("ranges").dense_bytes == 0.0  # ranges takes no dense mask
    assert fit.parameters["kernel_memory.sdpa.q_bytes"] == fit.hardware.memory("sdpa").q_bytes


def test_the_fitted_model_finds_the_measured_frontiers_and_the_bare_one_does_not() -> None:
    points = frontier_points(_records())
    tensors_alone = dataclasses.replace(load_profile("cpu_gloo_local"), kernel_memory={})
    fitted = fit_memory(points, tensors_alone).hardware
    checks = check_memory(points, fitted)
    assert within(checks, 0.1) == len(points)
    bare = check_memory(points, tensors_alone)  # far above
    assert all(c.ratio is not None and c.ratio < 0.75 for c in bare)


def test_the_command_prints_the_terms_and_the_table(tmp_path: Path, capsys) -> None:
    path = tmp_path / "frontiers.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in _records()))
    out = tmp_path / "fitted.yaml"
    assert main(["memory", str(path), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "kernel_memory.ranges.cp_fixed_mib" in said and "memory_margin" in said
    assert "20 of 20 predicted within ±25 %" in said and "predicted ≤ measured" in said
    fitted = load_profile(out)
    assert fitted.memory("sdpa").dense_bytes > 0 and fitted.memory("ranges").fixed_mib > 0
    # the profile says which command fitted its terms
    command = f"fitted by `python launchers/plan_fit.py memory {path} --out {out}` on 12 single"
    assert fitted.sources["kernel_memory"].startswith(command)
    assert fitted.sources["memory_margin"] == fitted.sources["kernel_memory"]
    assert run(["--check-memory", str(path)]) == 0
    said = capsys.readouterr().out
    assert "predicted within ±25 %" in said and "safe: predicted ≤ measured" in said


def test_records_without_a_frontier_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "plain.jsonl"
    plain = RunRecord(kernel="ranges", cp="none", mask="causal", seqlen=1024, status="ok")
    path.write_text(json.dumps(plain.to_dict()) + "\n")
    assert main(["memory", str(path)]) == 2
    assert "no frontier record" in capsys.readouterr().err
    assert run(["--check-memory", str(path)]) == 2
    assert "no frontier record" in capsys.readouterr().err
    # the fit is the lab tool's: the planner names it and its own record commands
    assert run(["--calibrate-memory", str(path)]) == 2
    err = capsys.readouterr().err
    assert "python launchers/plan_fit.py memory" in err and "--check-memory" in err


def _would_have_run(checks: list) -> int:
    """Cells whose predicted frontier is no longer than the measured one (none: nothing fits)."""
    return sum(1 for c in checks if c.predicted is None or c.predicted <= c.point.fits)


def test_a_cell_measured_twice_counts_once_at_its_shorter_frontier() -> None:
    first, other = _records()[:2]
    again = RunRecord.from_dict(first.to_dict())
    fits, fails = first.frontier_bracket  # type: ignore[misc]
    again.frontier_bracket = [fits - 128, fails - 128]  # type: ignore[operator]
    points = frontier_points([first, other, again])
    assert len(points) == 2
    assert sorted(p.fits for p in points) == sorted([fits - 128, other.frontier_bracket[0]])  # type: ignore[index,operator]


def test_the_margin_is_the_least_that_keeps_95_percent_of_the_cells_safe() -> None:
    # the fit's records measured 10 % below what the planted model fits: a model that counts
    # too little, as the shipped one did
    records = _records()
    for r in records:
        fits, fails = r.frontier_bracket  # type: ignore[misc]
        r.frontier_bracket = [int(fits * 0.9) // 512 * 512, fails]  # type: ignore[operator]
    points = frontier_points(records)
    held = fit_memory(points, _planted()).hardware
    assert held.memory_margin > 0
    assert _would_have_run(check_memory(points, held)) >= SAFE_SHARE * len(points)
    less = dataclasses.replace(held, memory_margin=held.memory_margin - 0.01)
    assert _would_have_run(check_memory(points, less)) < SAFE_SHARE * len(points)


@pytest.mark.parametrize("name", ["frontier_cpu_fit_records", "frontier_cpu_check_records"])
def test_the_shipped_profile_s_frontier_would_have_run_in_95_percent_of_the_measured_cells(
    name: str,
) -> None:
    points = frontier_points(read_records(DATA / f"{name}.jsonl"))
    checks = check_memory(points, load_profile("cpu_gloo_local"))
    assert _would_have_run(checks) >= 0.95 * len(checks)


def test_the_shipped_memory_terms_are_the_fit_of_the_committed_records() -> None:
    """`conf/hardware/cpu_gloo_local.yaml`'s ``kernel_memory`` and margin come back from the
    records and the command its ``sources`` name."""
    shipped = load_profile("cpu_gloo_local")
    points = frontier_points(read_records(DATA / "frontier_cpu_fit_records.jsonl"))
    fitted = fit_memory(points, dataclasses.replace(shipped, kernel_memory={})).hardware
    assert fitted.kernel_memory == shipped.kernel_memory
    assert fitted.memory_margin == shipped.memory_margin
    assert (
        "plan_fit.py memory notebooks/data/frontier_cpu_fit_records.jsonl"
        in (shipped.sources["kernel_memory"])
    )
