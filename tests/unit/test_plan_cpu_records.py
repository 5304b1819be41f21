"""The planner against real measurements made on this machine class (committed records).

``notebooks/data/plan_cpu_records.jsonl`` holds the CP runs of
``launchers/plan_cpu_measurements.sh``: 5 strategies x causal, causal_document, share_question
x world 2, 4, 6, 8, on gloo, each cell in three runs (a point is their median). Calibrating on
some of them must predict the others: a world size never seen (6), and a mask never seen
(share_question). The expectation is the measurements.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lcab.plan.calibrate import check, points_of
from lcab.plan.hardware import load_profile
from lcab.records.sinks import read_records
from plan_fit import fit_rates

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "notebooks" / "data" / "plan_cpu_records.jsonl"


@pytest.fixture(scope="module")
def points():
    return points_of(read_records(RECORDS))


def test_the_committed_measurements_cover_every_strategy_mask_and_world(points):
    cells = {(p.cell.cp, p.cell.mask, p.cell.world, p.pass_) for p in points}
    assert len(cells) == len(points) == 5 * 3 * 4 * 2


def test_every_cell_was_measured_in_three_runs():
    runs = Counter((r.cp, r.mask, r.world_size) for r in read_records(RECORDS))
    assert len(runs) == 5 * 3 * 4
    assert set(runs.values()) == {3}


@pytest.mark.parametrize(
    ("train", "held_out"),
    [
        (lambda p: p.cell.world != 6, lambda p: p.cell.world == 6),
        (lambda p: p.cell.mask != "share_question", lambda p: p.cell.mask == "share_question"),
    ],
    ids=["unseen-world-6", "unseen-mask-share_question"],
)
def test_calibrated_on_a_disjoint_subset_the_planner_predicts_the_rest(points, train, held_out):
    fit = fit_rates([p for p in points if train(p)], load_profile("cpu_gloo_local"))
    rows = check([p for p in points if held_out(p)], fit.hardware)
    errors = np.abs([r.error for r in rows])
    assert len(rows) >= 30
    assert np.median(errors) <= 0.15
    assert (errors <= 0.30).mean() >= 0.9  # planner guide: 30/30 and 39/40 within ±30 %
    assert errors.max() <= 0.40


def test_the_shipped_ranges_rates_are_the_kernels_only_fit_of_these_records(tmp_path):
    """`conf/hardware/cpu_gloo_local.yaml`'s ``ranges`` entry is reproducible from the records
    with the command its ``sources`` names; the links and memory are not refitted."""
    import subprocess
    import sys

    import yaml

    out = tmp_path / "fit.yaml"
    done = subprocess.run(
        [sys.executable, str(ROOT / "launchers" / "plan_fit.py"), "rates", str(RECORDS),
         "--hardware", "cpu_gloo_local", "--kernels-only", "--out", str(out)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fitted = yaml.safe_load(out.read_text())
    shipped = load_profile("cpu_gloo_local")
    assert (
        "plan_fit.py rates notebooks/data/plan_cpu_records.jsonl"
        in shipped.sources["kernels.ranges"]
    )
    rate = shipped.rate("ranges")
    assert rate.diagonal_rows == 128
    for name in ("fwd_tflops", "bwd_tflops", "half_keys", "bwd_half_keys"):
        assert fitted["kernels"]["ranges"][name] == pytest.approx(getattr(rate, name), rel=0.01)
    assert fitted["kernels"]["ranges"]["call_us"] < 1.0  # fitted to its lower bound, shipped 0
    assert fitted["intra"]["gbps"] == shipped.intra.gbps
    assert fitted["memory_gbps"] == shipped.memory_gbps
    assert fitted["kernels"]["default"] == yaml.safe_load(
        yaml.safe_dump(shipped.to_dict()["kernels"]["default"])
    )
