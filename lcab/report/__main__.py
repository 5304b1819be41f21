"""``python -m lcab.report COMMAND``: reports from lcab's registries and records.

Each command's ``--help`` (and the guide's table) says what it does. Each is a subparser
with its own ``run`` function; heavy imports (torch for the matrices, pandas/matplotlib/plotly
for the report) happen inside the commands.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_BAD_INPUT = 2
"""Exit status for input that cannot be reported on (as argparse uses for bad arguments)."""


def _command_of(module: str) -> Callable[[argparse.Namespace], int]:
    """The ``command`` function of ``module``, imported only when it runs."""
    return lambda args: int(importlib.import_module(module).command(args))


def _support(args: argparse.Namespace) -> int:
    from lcab.report.support import (
        gpu_strategy_matrix_markdown,
        kernel_matrix_markdown,
        strategy_matrix_markdown,
    )

    print(
        kernel_matrix_markdown(),
        strategy_matrix_markdown(),
        gpu_strategy_matrix_markdown(),
        sep="\n\n",
    )
    return 0


def _docs(args: argparse.Namespace) -> int:
    from lcab.report.generated_docs import GENERATED_FILES, update

    changed = update()
    for path in GENERATED_FILES:
        print(f"{path}: {'updated' if path in changed else 'already current'}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from lcab.report.build import build_report
    from lcab.report.frame import BadInputError

    try:
        report = build_report(args.paths, out=args.out)
    except BadInputError as err:
        print(f"python -m lcab.report build: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{report.num_records} records, {len(report.figures)} figures")
    for why in report.omitted:
        print(f"  not drawn: {why}")
    print(f"page: {report.index}")
    print(f"PNGs: {report.png_dir}")
    return 0


def _add_build(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    build = commands.add_parser(
        "build",
        help="HTML page, PNG plots and tables from records",
        description="Build a report from sweep folders, run folders or records.jsonl files "
        "(several are merged; NAME=PATH names one, and two named runs are compared: "
        "baseline=A new=B). Writes <first folder>/report/ unless --out is given.",
    )
    build.add_argument("paths", nargs="+", metavar="[NAME=]PATH")
    build.add_argument("--out", type=Path, default=None, metavar="DIR", help="output folder")
    build.set_defaults(run=_build)


def _gpu_table(args: argparse.Namespace) -> int:
    from lcab.report.gpu_verification import (
        cp_verification_markdown,
        read_verification,
        verification_markdown,
    )

    try:
        rows, cp_rows = read_verification(args.file), read_verification(args.file, cp=True)
    except (OSError, ValueError) as err:
        print(f"python -m lcab.report gpu-table: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(verification_markdown(rows))
    if cp_rows:  # the one-GPU CP step's strategy x kernel rows
        print("\n" + cp_verification_markdown(cp_rows))
    return 0


def _add_wandb_workspace(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from lcab.report import workspace  # light: wandb_workspaces is imported when it builds

    command = commands.add_parser(
        "wandb-workspace",
        help="the sweep's standard W&B workspace (saved; --dry-run writes its JSON offline)",
        description="Build the standard W&B workspace of a sweep's group: TFLOP/s vs seqlen by "
        "kernel, CP strategy and mask, per-GPU TFLOP/s vs world size, peak memory, numerical "
        "error, status counts. Saving needs a W&B login (wandb login or WANDB_API_KEY); "
        "--dry-run PATH writes the workspace JSON without one.",
    )
    workspace.add_arguments(command)
    command.set_defaults(run=workspace.main)


def _add_anchors(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    anchors = commands.add_parser(
        "anchors",
        help="published figures beside lcab's records and planner rows",
        description="Put published attention figures (the LongCA-bench paper, FlashAttention-3, "
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
    anchors.set_defaults(run=_command_of("lcab.report.anchors"))


def _add_compare(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    compare = commands.add_parser(
        "compare",
        help="two campaigns compared cell by cell, with what differs between them",
        description="Compare two campaigns (records files, sweep or run folders, or "
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
    compare.set_defaults(run=_command_of("lcab.report.compare"))


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per report."""
    top = argparse.ArgumentParser(prog="python -m lcab.report")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("support", help="print the support matrices").set_defaults(run=_support)
    commands.add_parser("docs", help="rewrite the generated sections of every doc").set_defaults(
        run=_docs
    )
    _add_build(commands)
    _add_wandb_workspace(commands)
    table = commands.add_parser(
        "gpu-table", help="the GPU verification table of a gpu_check.sh run (Markdown)"
    )
    table.add_argument("file", type=Path, help="the run's verification.jsonl")
    table.set_defaults(run=_gpu_table)
    _add_anchors(commands)
    _add_compare(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one report command; its exit status."""
    args = parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
