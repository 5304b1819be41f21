"""``python -m lcab.plan --calibrate-memory | --check-memory RECORDS``: frontiers fitted, checked.

Both print every frontier record beside the model's frontier for the same search, how many are
within ±25 % and how many are safe (predicted ≤ measured: the planner's length would have run);
``--calibrate-memory`` first fits the kernels' memory terms and the margin on those records
(`lcab.plan.calibrate_memory`) and prints them as the profile's YAML keys, or writes the
profile with them to ``--out``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.table import Table

from lcab.plan.calibrate_memory import (
    SAFE_SHARE,
    check_memory,
    fit_memory,
    frontier_points,
    within,
)
from lcab.plan.hardware import Hardware
from lcab.records.schema import RunRecord
from lcab.records.table import console


def memory_command(records: list[RunRecord], hardware: Hardware, fit: bool, out: str | None) -> int:
    """Fit (``fit``) or check ``hardware``'s memory terms on the frontier ``records``.

    Raises:
        ValueError: no record found a frontier under a budget, or none to fit on.

    """
    points = frontier_points(records)
    if not points:
        raise ValueError(
            "no frontier record with a budget and both ends of its bracket "
            "(seqlen=frontier bench.memory_budget_gib=...)"
        )
    screen = console()
    if fit:
        found = fit_memory(points)
        hardware = found.apply(hardware)
        terms = {
            "kernel_memory": {k: vars(v) for k, v in found.kernels.items()},
            "memory_margin": found.margin,
        }
        screen.print(
            f"fitted on {found.single} single-device and {found.parallel} context-parallel "
            "frontiers (the middle of each bracket taken as the budget; the margin keeps "
            f"{SAFE_SHARE:.0%} of them safe):"
        )
        print(yaml.safe_dump(terms, sort_keys=False), end="")
        if out:
            Path(out).write_text(yaml.safe_dump(hardware.to_dict(), sort_keys=False))
            screen.print(f"profile with these terms -> {out}")
    checks = check_memory(points, hardware)
    table = Table(title=f"memory frontier, measured vs predicted on {hardware.name}")
    columns = ("cell", "measured", "did not fit", "predicted", "measured / predicted", "safe")
    for name in columns:
        table.add_column(name, justify="left" if name == "cell" else "right")
    for c in checks:
        table.add_row(
            c.point.label(),
            f"{c.point.fits:,}",
            f"{c.point.fails:,}",
            "-" if c.predicted is None else f"{c.predicted:,}",
            "-" if c.ratio is None else f"{c.ratio:.2f}",
            "yes" if c.safe else "[red]no[/]",
        )
    screen.print(table)
    safe = sum(c.safe for c in checks)
    screen.print(
        f"{within(checks)} of {len(checks)} predicted within ±25 % of the measured; "
        f"{safe} of {len(checks)} ({safe / len(checks):.0%}) safe: predicted ≤ measured "
        f"(the predicted frontier would have run; margin {hardware.memory_margin:.0%})"
    )
    return 0
