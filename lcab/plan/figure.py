"""The planner's plot: predicted per-GPU TFLOP/s against world size, one line per strategy.

Measured points (records of the same masks and strategies) are drawn as markers on the same
axes, so a reader sees at once where a measurement leaves the prediction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from lcab.records.sinks import read_records


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
            points = [
                (m.world_size, m.pass_result(pass_).tflops)
                for m in measured
                if (m.mask, m.cp, m.status) == (mask, cp, "ok") and m.pass_result(pass_).tflops
            ]
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
