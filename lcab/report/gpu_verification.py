"""The GPU verification table: what a GPU run of the ``gpu`` test tier showed, kernel × mask.

`launchers/gpu_check.sh` runs ``tests/gpu`` on a CUDA machine with
``LCAB_GPU_VERIFICATION=<file>``; every case appends one JSON line (kernel, mask, pass, verdict,
errors or reason, versions, GPU name). Those lines are the only source of a "GPU-verified"
claim: nothing here runs a kernel. Rows with ``cp`` come from the one-GPU CP step
(``tests.gpu.cp_shared``: a kernel under a strategy, ranks sharing the GPU); `read_verification`
keeps them apart, so the support matrix's kernel marks never read a CP verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

VERDICT_MARK = {"verified": "verified", "failed": "FAILED", "unsupported": "–"}
"""How a (pass) verdict reads in a table cell."""


def is_cp_row(row: dict[str, Any]) -> bool:
    """Whether a verification row judges a kernel under a CP strategy."""
    return row.get("cp") not in (None, "none")


def read_verification(path: str | Path, cp: bool = False) -> list[dict[str, Any]]:
    """Kernel rows (or CP rows) of a verification file; ValueError names a bad line."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err})") from err
        needed = ("kernel", "mask", "pass", "verdict") + (("world",) if is_cp_row(row) else ())
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"{path}:{number}: missing {', '.join(missing)}")
        if is_cp_row(row) == cp:
            rows.append(row)
    return rows


def _gaps(rows: list[dict[str, Any]], masks: set[str]) -> list[str]:
    """What the run could not judge: kernels whose package was missing, masks never recorded."""
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
    """Markdown: the run's environment, kernel × mask ``fwd / bwd`` verdicts, errors below."""
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


def _strategy_label(row: dict[str, Any]) -> str:
    options = ",".join(f"{k}={v}" for k, v in sorted((row.get("cp_options") or {}).items()))
    return f"`{row['cp']}`" + (f" [{options}]" if options else "") + f" @{row['world']}"


def cp_verification_markdown(rows: list[dict[str, Any]]) -> str:
    """Markdown: strategy × kernel rows, a column per mask, cells ``fwd / bwd`` verdicts.

    The ranks shared one GPU over gloo: numerics and bytes, never a timing. Refusals (`–`) are
    counted below the table with their first reason.
    """
    if not rows:
        return "No CP verification records."
    env = next((r for r in rows if r.get("gpu")), rows[0])  # a world's failure row has none
    shared = any(r.get("shared_device") for r in rows)
    lines = [
        f"CP on one GPU: {env.get('gpu')}, torch {env.get('torch')}; ranks "
        + ("shared the GPU over gloo" if shared else "on their own devices over gloo")
        + f" (staging: {env.get('staging', '?')}). Numerics vs fp64 and bytes vs the plan.",
        "",
    ]
    cells: dict[tuple[str, str], dict[str, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    refused: dict[tuple[str, str], str] = {}
    failures = []
    for row in rows:
        key = (_strategy_label(row), row["kernel"])
        cells[key][row["mask"]][row["pass"]] = VERDICT_MARK.get(row["verdict"], row["verdict"])
        if row["verdict"] == "unsupported":
            refused.setdefault(key, str(row.get("reason", ""))[:160])
        if row["verdict"] == "failed":
            why = row.get("error") or json.dumps(
                {k: row.get(k) for k in ("errors", "bounds", "comm_bytes")}, sort_keys=True
            )
            failures.append(f"- {key[0]} × `{key[1]}` × `{row['mask']}` {row['pass']}: {why}")
    masks = sorted({r["mask"] for r in rows})
    ran = sorted(
        k
        for k, by_mask in cells.items()
        if any(
            v != VERDICT_MARK["unsupported"]
            for verdicts in by_mask.values()
            for v in verdicts.values()
        )
    )
    lines.append("| strategy | kernel | " + " | ".join(f"`{m}`" for m in masks) + " |")
    lines.append("|---" * (len(masks) + 2) + "|")
    for strategy, kernel in ran:
        by_mask = cells[(strategy, kernel)]
        row_cells = [" / ".join(by_mask[m].get(p, "·") for p in ("fwd", "bwd")) for m in masks]
        lines.append(f"| {strategy} | `{kernel}` | " + " | ".join(row_cells) + " |")
    lines += [
        "",
        "Cells: fwd / bwd; `–` refused (the strategy's or kernel's reason), `·` no record.",
    ]
    others = sorted(set(refused) - set(ran))
    if others:
        lines += ["", f"Refused everywhere ({len(others)} strategy × kernel pairs), e.g.:"]
        lines += [f"- {s} × `{k}`: {refused[(s, k)]}" for s, k in others[:8]]
    if failures:
        lines += ["", "Failures:", *failures]
    return "\n".join(lines)


def command(args: argparse.Namespace) -> int:
    """``report gpu-table FILE``: the kernel table, then the CP table (2: a bad file)."""
    try:
        rows, cp_rows = read_verification(args.file), read_verification(args.file, cp=True)
    except (OSError, ValueError) as err:
        print(f"python -m lcab.report gpu-table: {err}", file=sys.stderr)
        return 2
    print(verification_markdown(rows))
    if cp_rows:
        print("\n" + cp_verification_markdown(cp_rows))
    return 0
