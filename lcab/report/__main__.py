"""``python -m lcab.report COMMAND``: reports from lcab's registries and records.

Each command's ``--help`` (and the guide's table) says what it does; each is run by its
module's ``command``, imported only then, so torch, pandas, matplotlib and plotly load only
for the commands that need them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from lcab.report.workspace import add_arguments as add_workspace_arguments


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per report, each run by its module's ``command``."""
    top = argparse.ArgumentParser(prog="python -m lcab.report")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, module: str, summary: str, description: str = "") -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=description or None)
        sub.set_defaults(module=f"lcab.report.{module}")
        return sub

    add("support", "support", "print the support matrices")
    add("docs", "generated_docs", "rewrite the generated sections of every doc")
    build = add(
        "build",
        "build",
        "HTML page, PNG plots and tables from records",
        "Build a report from sweep folders, run folders or records.jsonl files "
        "(several are merged; NAME=PATH names one, and two named runs are compared: "
        "baseline=A new=B). Writes <first folder>/report/ unless --out is given.",
    )
    build.add_argument("paths", nargs="+", metavar="[NAME=]PATH")
    build.add_argument("--out", type=Path, default=None, metavar="DIR", help="output folder")
    workspace = add(
        "wandb-workspace",
        "workspace",
        "the sweep's standard W&B workspace (saved; --dry-run writes its JSON offline)",
        "Build the standard W&B workspace of a sweep's group: TFLOP/s vs seqlen by "
        "kernel, CP strategy and mask, per-GPU TFLOP/s vs world size, peak memory, numerical "
        "error, status counts. Saving needs a W&B login (wandb login or WANDB_API_KEY); "
        "--dry-run PATH writes the workspace JSON without one.",
    )
    add_workspace_arguments(workspace)
    table = add(
        "gpu-table",
        "gpu_verification",
        "the GPU verification table of a gpu_check.sh run (Markdown)",
    )
    table.add_argument("file", type=Path, help="the run's verification.jsonl")
    anchors = add(
        "anchors",
        "anchors",
        "published figures beside lcab's records and planner rows",
        "Put published attention figures (the LongCA-bench paper, FlashAttention-3, "
        "cudnn-frontend, the MagiAttention benchmark: lcab/records/published.json) "
        "beside the lcab rows of the same problem, with the ratio lcab / published. Records "
        "are measured, the planner's plan.jsonl rows predicted.",
    )
    anchors.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="records files, sweep or run folders, plan.jsonl files or planner sweep folders",
    )
    anchors.add_argument(
        "--all", action="store_true", help="also list published figures without a match, and why"
    )
    anchors.add_argument("--markdown", action="store_true", help="print a Markdown table")
    compare = add(
        "compare",
        "compare",
        "two campaigns compared cell by cell, with what differs between them",
        "Compare two campaigns (records files, sweep or run folders, or "
        "wandb:ENTITY/PROJECT/GROUP; NAME=... labels one): per matched cell and pass the time "
        "ratio NEW/OLD with a 95 %% interval from the timed repetitions and a verdict, the "
        "provenance side by side, cells of one campaign only. Writes compare.csv, compare.md "
        "and png/ to --out (default: <NEW's folder>/compare).",
    )
    compare.add_argument("old", metavar="[NAME=]OLD")
    compare.add_argument("new", metavar="[NAME=]NEW")
    compare.add_argument("--out", type=Path, default=None, metavar="DIR", help="output folder")
    compare.add_argument(
        "--fail-slower",
        type=float,
        metavar="PCT",
        help="exit 1 when a pass is slower than PCT %% beyond its interval, or stopped running",
    )
    compare.add_argument("--wandb-report", action="store_true", help="save it as a W&B report")
    compare.add_argument(
        "--wandb-dry-run", type=Path, metavar="PATH", help="write that report's JSON (offline)"
    )
    compare.add_argument("--entity", help="W&B entity (default: $WANDB_ENTITY, the inputs')")
    compare.add_argument("--project", help="W&B project (default: the inputs', else lcab)")
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one report command; its exit status."""
    args = parser().parse_args(argv)
    return int(importlib.import_module(args.module).command(args))


if __name__ == "__main__":
    sys.exit(main())
