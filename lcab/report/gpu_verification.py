"""The GPU verification table: what a GPU run of the ``gpu`` test tier showed, kernel × mask.

`launchers/gpu_check.sh` runs ``tests/gpu`` on a CUDA machine with
``LCAB_GPU_VERIFICATION=<file>``; every case appends one JSON line (kernel, mask, pass, verdict
``verified`` / ``failed`` / ``unsupported``, errors or reason, versions, GPU name). This module
turns those lines into the Markdown table the README shows — the only source of a
"GPU-verified" claim: nothing here runs a kernel, it reports what the GPU run wrote.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

VERDICT_MARK = {"verified": "verified", "failed": "FAILED", "unsupported": "–"}
"""How a (pass) verdict reads in a table cell."""


def read_verification(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of a verification file (blank lines ignored).

    Raises:
        ValueError: a line is not JSON or lacks kernel, mask, pass or verdict (line named).

    """
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err})") from err
        missing = [k for k in ("kernel", "mask", "pass", "verdict") if k not in row]
        if missing:
            raise ValueError(f"{path}:{number}: missing {', '.join(missing)}")
        rows.append(row)
    return rows


def _gaps(rows: list[dict[str, Any]], masks: set[str]) -> list[str]:
    """Lines naming what the run could not judge.

    Kernels whose package was missing (their ``–`` says nothing of the kernel) and registered
    masks no case recorded.
    """
    from lcab.masks import list_masks

    missing = sorted({r["kernel"] for r in rows if "not installed" in str(r.get("reason", ""))})
    unrecorded = [m for m in list_masks() if m not in masks]
    lines = []
    if missing:
        names = ", ".join(f"`{k}`" for k in missing)
        lines += ["", f"Not installed on this machine (their `–` judges nothing): {names}."]
    if unrecorded:
        names = ", ".join(f"`{m}`" for m in unrecorded)
        lines += ["", f"Masks with no record (no case ran): {names}."]
    return lines


def verification_markdown(rows: list[dict[str, Any]]) -> str:
    """Markdown: the run's environment, then kernel × mask cells ``fwd / bwd`` verdicts.

    A failed pass names its error below the table, so a reader sees what broke, not only that
    something did; an unsupported pass is ``–`` (the support matrix says why).
    """
    if not rows:
        return "No GPU verification records."
    env = rows[0]
    lines = [
        f"GPU run: {env.get('gpu')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, "
        f"Python {env.get('python')}.",
        "",
    ]
    cells: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    versions: dict[str, str] = {}
    failures = []
    for row in rows:
        cells[(row["kernel"], row["mask"])][row["pass"]] = VERDICT_MARK.get(
            row["verdict"], row["verdict"]
        )
        if row.get("package"):
            versions[row["kernel"]] = f"{row['package']} {row.get('package_version') or '?'}"
        if row["verdict"] == "failed":
            why = row.get("error") or json.dumps(row.get("errors"), sort_keys=True)
            failures.append(f"- `{row['kernel']}` × `{row['mask']}` {row['pass']}: {why}")
    kernels = sorted({k for k, _ in cells})
    masks = sorted({m for _, m in cells})
    lines.append("| kernel | " + " | ".join(f"`{m}`" for m in masks) + " |")
    lines.append("|---" * (len(masks) + 1) + "|")
    for kernel in kernels:
        label = f"`{kernel}`" + (f" ({versions[kernel]})" if kernel in versions else "")
        row_cells = []
        for mask in masks:
            verdicts = cells.get((kernel, mask), {})
            row_cells.append(" / ".join(verdicts.get(p, "·") for p in ("fwd", "bwd")))
        lines.append(f"| {label} | " + " | ".join(row_cells) + " |")
    lines += [
        "",
        "Cells: fwd / bwd; `–` declared unsupported (see the support matrix), `·` no record.",
    ]
    lines += _gaps(rows, set(masks))
    if failures:
        lines += ["", "Failures:", *failures]
    return "\n".join(lines)
