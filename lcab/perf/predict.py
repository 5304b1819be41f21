"""How well ``hardware=auto`` predicts CPU cells the planner was never fitted on.

Cells outside the shipped CPU profile's fit (`CELLS`, `MORE_CELLS`), run with the fit's heads,
kernel and protocol through ``python -m lcab.main hardware=auto``, each pass the median of
``$LCAB_PERF_RUNS`` runs; target: >= 90 % of passes within ±30 %. Figures: ``lcab/plan/README.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lcab.records.schema import RunRecord

TOLERANCE = 0.30
TARGET = 0.90

CELLS = [
    "cp=ulysses,ring,ring_allgather",
    "mask=full,prefix_lm_causal",
    "topology=local2,local4",
    "seqlen.values=[768]",
    "seqlen.per_device=true",
]
"""The multirun's axes: 12 cells, 24 passes, none of them in the profile's fit."""

MORE_CELLS = [
    "cp=ulysses,ring,ring_allgather",
    "mask=full_document,sliding_window_causal,causal_blockwise",
    "topology=local2,local4",
    "seqlen.values=[1024]",
    "seqlen.per_device=true",
]
"""A second unseen set (``python -m lcab.perf predict-more``): 18 cells, 36 passes."""

PROTOCOL = [
    "kernel=ranges",
    "hardware=auto",
    "problem.heads_q=24",
    "problem.heads_kv=8",
    "problem.head_dim=32",
    "bench.warmup=1",
    "bench.reps=5",
    "bench.mask_samples=1",
    "bench.check_numerics=false",
    "bench.progress=false",
]
"""The fit's protocol (``launchers/plan_cpu_measurements.sh``)."""


def _records(root: Path) -> list[RunRecord]:
    out = []
    for path in sorted(root.glob("*/records.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.append(RunRecord.from_dict(json.loads(line)))
    return out


def runs() -> int:
    """Runs of the whole set: ``$LCAB_PERF_RUNS``, default 3 (a stalled run does not decide)."""
    try:
        return max(int(os.environ.get("LCAB_PERF_RUNS", "3")), 1)
    except ValueError:
        return 3


def run() -> None:
    """Run the unseen cells, print predicted vs measured per pass and the share within."""
    run_cells(CELLS)


def run_more() -> None:
    """The same for the second unseen set (`MORE_CELLS`)."""
    run_cells(MORE_CELLS)


def run_cells(axes: list[str]) -> None:
    """Run the multirun ``axes``, print predicted vs measured and the share within."""
    start = time.perf_counter()
    records: list[RunRecord] = []
    with tempfile.TemporaryDirectory(prefix="lcab-perf-predict-") as tmp:
        for n in range(runs()):
            sweep = Path(tmp) / f"run{n}"
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "lcab.main",
                    "-m",
                    *axes,
                    *PROTOCOL,
                    f"hydra.sweep.dir={sweep}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                print(f"lcab.main failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
                return
            records += _records(sweep)
    took = time.perf_counter() - start
    if not records:
        print("lcab.main wrote no records")
        return
    print(
        f"{len(records)} cell runs ({runs()} runs) in {took:.0f} s; "
        f"profile {records[0].predicted_hardware}; each pass the median of its runs"
    )
    print(f"{'cell':<46} {'pass':<4} {'measured ms':>11} {'predicted':>10} {'ratio':>6}")
    cells: dict[tuple[str, str, int, int], list[RunRecord]] = {}
    for r in records:
        cells.setdefault((r.cp, r.mask, r.world_size, r.seqlen), []).append(r)
    ratios: list[float] = []
    for (cp, mask, world, seqlen), group in sorted(cells.items()):
        label = f"{cp}/{mask}/world {world}/S={seqlen}"
        ok = [r for r in group if r.status == "ok"]
        if not ok:
            print(f"{label:<46} {group[0].status}: {'; '.join(group[0].reasons)[:60]}")
            continue
        for name in ok[0].passes:
            results = [r.pass_result(name) for r in ok]
            predicted = results[0].predicted_ms
            times = [x.ms_p50 for x in results if x.ms_p50]
            if predicted is None or not times:
                print(f"{label:<46} {name:<4} no prediction: {ok[0].prediction_note}")
                continue
            measured = statistics.median(times)
            ratio = predicted / measured
            ratios.append(ratio)
            mark = "" if abs(ratio - 1) <= TOLERANCE else "  <- outside ±30 %"
            print(f"{label:<46} {name:<4} {measured:11.1f} {predicted:10.1f} {ratio:6.2f}{mark}")
    within = sum(abs(x - 1) <= TOLERANCE for x in ratios)
    share = within / len(ratios) if ratios else 0.0
    verdict = "meets" if share >= TARGET else "misses"
    print(
        f"{within} of {len(ratios)} passes within ±30 % ({share:.0%}; {verdict} the target of "
        f"{TARGET:.0%}); median predicted/measured "
        f"{statistics.median(ratios) if ratios else float('nan'):.2f}"
    )
