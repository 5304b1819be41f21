"""A comparison of two campaigns on W&B: groups as inputs, the comparison as a W&B report.

Input ``wandb:ENTITY/PROJECT/GROUP``: the ``lcab-records`` artifact of every run of the group is
downloaded into a fresh folder and read like any records folder. The report (wandb-workspaces,
as `lcab.report.workspace`): the comparison's Markdown, then one run set per campaign that has a
W&B group. A run set names no entity or project of its own (it takes the report's):
wandb-workspaces would look one up on the server while serialising, which offline cannot do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from lcab.report.frame import named_input
from lcab.report.workspace import DEFAULT_PROJECT, STEP, read_sweep, save, workspace_json

PREFIX = "wandb:"
ARTIFACT_TYPE = "lcab-records"
API_TIMEOUT_S = 30
"""Seconds a W&B API call may take before the command gives up (a firewall that drops)."""


def _spec(given: str) -> tuple[str, str, str] | None:
    """(entity, project, group) of a ``wandb:`` input (ValueError: malformed); None for a path."""
    text = str(named_input(given)[1])
    if not text.startswith(PREFIX):
        return None
    parts = text.removeprefix(PREFIX).split("/", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{text}: expected {PREFIX}ENTITY/PROJECT/GROUP")
    return parts[0], parts[1], parts[2]


def fetched(given: str) -> str:
    """``given`` itself, or for a ``wandb:`` input a folder holding its group's records.

    ValueError, one line: a malformed input, W&B unreachable or refusing, no records artifact.
    """
    spec = _spec(given)
    if spec is None:
        return given
    entity, project, group = spec
    folder = Path(tempfile.mkdtemp(prefix=f"lcab-compare-{group}-"))
    try:
        import wandb

        api = wandb.Api(timeout=API_TIMEOUT_S)
        for run in api.runs(f"{entity}/{project}", filters={"group": group}):
            for artifact in run.logged_artifacts():
                if artifact.type == ARTIFACT_TYPE:
                    artifact.download(root=str(folder / run.id))
    except Exception as err:  # auth, network, a missing project: one line
        raise ValueError(f"{PREFIX}{entity}/{project}/{group}: W&B: {err}") from err
    if not any(folder.rglob("*.jsonl")):
        raise ValueError(f"{PREFIX}{entity}/{project}/{group}: no run with an {ARTIFACT_TYPE}")
    name = named_input(given)[0]
    return f"{name}={folder}" if name else str(folder)


def _where(given: str) -> tuple[str | None, str | None, str | None]:
    """(entity, project, group) an input says: a ``wandb:`` spec, or a sweep's logger config."""
    spec = _spec(given)
    if spec is not None:
        return spec
    try:
        runs = read_sweep(named_input(given)[1])
    except ValueError:  # a records file: no group
        return None, None, None
    return runs.entity, runs.project, runs.group


def build_report(args: argparse.Namespace, labels: tuple[str, str], text: str) -> Any:
    """The comparison (``labels``: old, new) as a ``wandb_workspaces`` report, not saved.

    ValueError: no entity (``--entity``, ``$WANDB_ENTITY``, a ``wandb:`` input or a sweep's).
    """
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    places = [_where(p) for p in (args.old, args.new)]
    entity = (
        args.entity or os.environ.get("WANDB_ENTITY") or next((e for e, _, _ in places if e), None)
    )
    if not entity:
        raise ValueError("no W&B entity: pass --entity or set WANDB_ENTITY")
    project = args.project or next((p for _, p, _ in places if p), None) or DEFAULT_PROJECT
    old, new = labels
    blocks: list[Any] = [wr.H1(f"lcab: {new} vs {old}"), wr.MarkdownBlock(text=text)]
    runsets = [
        wr.Runset(name=label, filters=[expr.Metric("Group") == group])
        for label, (_, _, group) in zip(labels, places, strict=True)
        if group
    ]
    if runsets:
        panels: list[Any] = [
            wr.LinePlot(
                title=f"{m} by kernel", x=STEP, y=[m], log_x=True, groupby=wr.Config("kernel")
            )
            for m in ("fwd_tflops", "bwd_tflops")
        ]
        blocks.append(wr.PanelGrid(runsets=runsets, panels=panels))
    return wr.Report(entity=entity, project=project, title=f"lcab {new} vs {old}", blocks=blocks)


def wandb_report(args: argparse.Namespace, labels: tuple[str, str], text: str) -> int:
    """Write (``--wandb-dry-run``) or save (``--wandb-report``) the report; 0, else 1 or 2."""
    try:
        report = build_report(args, labels, text)
    except ValueError as err:
        print(f"lcab compare: {err}", file=sys.stderr)
        return 2
    if args.wandb_dry_run:
        text = json.dumps(workspace_json(report), indent=1) + "\n"
        args.wandb_dry_run.write_text(text, encoding="utf-8")
        print(f"W&B report (not saved): {args.wandb_dry_run}")
    if args.wandb_report:
        return save(report, "the W&B report", "--wandb-dry-run")
    return 0
