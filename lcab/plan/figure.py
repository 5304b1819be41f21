"""The planner's plot: predicted per-GPU TFLOP/s against world size, one line per strategy.

Measured points (records of the same masks and strategies) are drawn as markers on the same
axes, so a reader sees at once where a measurement leaves the prediction; records whose ranks
shared a GPU (`RunRecord.timings_measured`) are not measurements and are left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from lcab.records.schema import RunRecord
from lcab.records.sinks import read_records


def measured_points(
    records: list[RunRecord], mask: str, cp: str, pass_: str
) -> list[tuple[int, float]]:
    """(world size, TFLOP/s per GPU) of the ``ok`` records of a mask and strategy.

    Only those whose times are a measurement: a run whose ranks shared a GPU is a numerics check.
    """
    return [
        (r.world_size, tflops)
        for r in records
        if (r.mask, r.cp, r.status) == (mask, cp, "ok")
        and r.timings_measured
        and (tflops := r.pass_result(pass_).tflops)
    ]


def plot_scaling(
    rows: list[dict[str, Any]], path: Path, records: str | None = None, pass_: str = "fwd"
) -> Path:
    """Write the plot of ``rows`` (`CellPrediction.row` dicts) to ``path``; return it."""
    masks = sorted({r["mask"] for r in rows})
    fig, axes = plt.subplots(1, len(masks), figsize=(5.5 * len(masks), 4), squeeze=False)
    measured = read_records(Path(records)) if records else []
    for ax, mask in zip(axes[0], masks, strict=True):
        for cp in sorted({r["cp"] for r in rows if r["mask"] == mask}):
            line = sorted(
                (r["world"], r[f"{pass_}_tflops"])
                for r in rows
                if (r["mask"], r["cp"]) == (mask, cp)
            )
            (handle,) = ax.plot(*zip(*line, strict=True), marker=".", label=f"{cp} (predicted)")
            points = measured_points(measured, mask, cp, pass_)
            if points:
                ax.scatter(
                    *zip(*points, strict=True),
                    color=handle.get_color(),
                    marker="x",
                    label=f"{cp} (measured)",
                )
        ax.set_title(f"{mask}, {pass_}")
        ax.set_xlabel("GPUs (world size)")
        ax.set_ylabel("TFLOP/s per GPU")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
