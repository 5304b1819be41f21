"""W&B dashboards as code: the standard workspace of one lcab sweep's W&B group.

Sections (one W&B run per cell, `lcab.records.wandb_run`): TFLOP/s against ``seqlen`` by kernel,
by CP strategy (and by mask with several masks); per-GPU headline TFLOP/s against
``world_size`` (a scatter over runs: each run has one world size, so no history axis shows it)
and a parallel coordinates plot; measured vs predicted; peak memory; numerical error; status
counts. The runset is filtered to the sweep's group.

Why it is built this way:

* wandb-workspaces 0.4.13 filters only the whole workspace (no section or panel filter), so a
  section per mask would show every mask under a false title; ``--mask`` narrows the runset to
  one mask instead (one saved view per mask).
* A kernel's group mixes the sweep's other axes, so a mean means nothing: panels aggregate with
  ``max`` and shade ``minmax`` (the best the group reached, and its spread).
* W&B fetches 10 runs per panel by default and draws groups from those only, so ``max_runs`` is
  raised to the sweep's number of cells.

Building and serialising need no network or login (only ``save`` calls the W&B API; the tests
check this with sockets disabled); ``wandb_workspaces`` is imported inside the functions, as
importing it takes seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from wandb_workspaces.workspaces import Section, Workspace

DEFAULT_PROJECT = "lcab"
"""Project when neither ``--project`` nor the sweep's ``logger.project`` names one."""
STATUS_KEYS = ("n_ok", "n_skipped", "n_error", "n_timeout", "n_oom", "n_numerics_mismatch")
"""Summary keys of `WandbLogger`: how many lengths of a run ended in each status."""
HEADLINE_KEYS = ("headline/seqlen", "headline/fwd_tflops", "headline/bwd_tflops")
"""Summary keys of the largest ``ok`` length of a run."""
CONFIG_AXES = ("kernel", "cp", "mask", "world_size")
"""Run config keys (flat, see `lcab.records.wandb_run.run_config`) shown next to the figures."""
STEP = "seqlen"
"""The history's step metric (``define_metric("*", step_metric="seqlen")``)."""


@dataclass(frozen=True)
class SweepRuns:
    """What a sweep folder says about its W&B runs (read from its job folders' configs)."""

    folder: Path
    group: str
    masks: tuple[str, ...]
    cells: int
    """Job folders: one W&B run each."""
    logged: int
    """Job folders whose logger was W&B (the others have no run to show)."""
    project: str | None
    entity: str | None


def _job_folders(sweep: Path) -> tuple[list[Path], Path]:
    """The job folders of ``sweep`` and the folder its W&B group is named after."""
    expected = (
        "expected an lcab sweep folder (<sweep>/<n>_<overrides>/.hydra/config.yaml) "
        "or a single run's folder (<run>/.hydra/config.yaml)"
    )
    if not sweep.is_dir():
        raise ValueError(f"{sweep}: no such folder; {expected}")
    if (sweep / ".hydra" / "config.yaml").is_file():
        if (sweep.parent / "multirun.yaml").is_file():  # a cell's runs are in its sweep's group
            raise ValueError(f"{sweep}: a job folder of sweep {sweep.parent}; pass the sweep")
        return [sweep], sweep
    jobs = sorted(p for p in sweep.iterdir() if (p / ".hydra" / "config.yaml").is_file())
    if not jobs:
        raise ValueError(f"{sweep}: no job folders; {expected}")
    return jobs, sweep


def _select(cfg: DictConfig, key: str) -> Any:
    """``cfg[key]`` or None (missing, or an interpolation that cannot resolve here)."""
    return OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)


def _load(path: Path) -> DictConfig:
    """A job's config, or a ValueError naming the file (a half-written or hand-edited job)."""
    try:
        cfg = OmegaConf.load(path)
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: unreadable ({type(err).__name__})") from err
    if not isinstance(cfg, DictConfig):
        raise ValueError(f"{path}: not a mapping")
    return cfg


def read_sweep(sweep: Path) -> SweepRuns:
    """The W&B group, masks and logger settings of ``sweep``'s cells.

    ValueError: not a sweep (or run) folder, or its cells log to several groups.
    """
    from lcab.records.wandb_run import group_of_folder  # imports torch: only when needed

    sweep = Path(sweep)
    jobs, group_folder = _job_folders(sweep)
    cfgs = [_load(job / ".hydra" / "config.yaml") for job in jobs]
    groups = {_select(c, "logger.group") or group_of_folder(group_folder) for c in cfgs}
    if len(groups) > 1:
        raise ValueError(f"{sweep}: its cells log to several W&B groups: {sorted(groups)}")
    wandb = [c for c in cfgs if _select(c, "logger.name") == "wandb"]
    return SweepRuns(
        folder=sweep,
        group=groups.pop(),
        masks=tuple(sorted({str(m) for c in cfgs if (m := _select(c, "mask.name"))})),
        cells=len(cfgs),
        logged=len(wandb),
        project=next((p for c in wandb if (p := _select(c, "logger.project"))), None),
        entity=next((e for c in wandb if (e := _select(c, "logger.entity"))), None),
    )


def _by(key: str, title: str, metrics: tuple[str, ...], log_y: bool = False) -> Section:
    """A section of one line plot per metric against seqlen, runs grouped by config ``key``."""
    import wandb_workspaces.reports.v2 as wr

    panels = [
        wr.LinePlot(
            title=f"{metric} by {key}",
            x=STEP,
            y=[metric],
            log_x=True,  # lengths are powers of two
            log_y=log_y or None,
            title_x=STEP,
            groupby=wr.Config(key),
            groupby_aggfunc="max",
            groupby_rangefunc="minmax",
        )
        for metric in metrics
    ]
    return _section(title, panels)


def _section(title: str, panels: list[Any]) -> Section:
    """An open section laid out one row of panels per page."""
    import wandb_workspaces.workspaces as ws

    layout = ws.SectionLayoutSettings(columns=min(3, len(panels)), rows=1)
    return ws.Section(name=title, panels=panels, is_open=True, layout_settings=layout)


def _headline_scatters(title: str, x: Any) -> list[Any]:
    """Headline TFLOP/s (each run's largest ``ok`` length) of fwd and bwd against ``x``."""
    import wandb_workspaces.reports.v2 as wr

    return [
        wr.ScatterPlot(
            title=f"{pass_} TFLOP/s per GPU {title} (headline length)",
            x=x(pass_),
            y=wr.SummaryMetric(f"headline/{pass_}_tflops"),
        )
        for pass_ in ("fwd", "bwd")
    ]


def _scaling() -> Section:
    """Per-GPU headline TFLOP/s against world size, one point per run; runs' lengths beside."""
    import wandb_workspaces.reports.v2 as wr

    scatters = _headline_scatters("vs world size", lambda _: wr.Config("world_size"))
    axes = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in CONFIG_AXES]
    heads = [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(k)) for k in HEADLINE_KEYS]
    coords = wr.ParallelCoordinatesPlot(title="headline per run", columns=[*axes, *heads])
    return _section("Scaling with world size", [*scatters, coords])


def _planned() -> Section:
    """Headline TFLOP/s against the planner's: far off the diagonal, a run far from its model."""
    import wandb_workspaces.reports.v2 as wr

    scatters = _headline_scatters(
        ": measured vs predicted", lambda p: wr.SummaryMetric(f"headline/{p}_predicted_tflops")
    )
    return _section("Measured vs predicted", scatters)


def _status() -> Section:
    """How many lengths ended in each status, summed per kernel and per CP strategy."""
    import wandb_workspaces.reports.v2 as wr

    bars = [
        wr.BarPlot(
            title=f"status counts by {key}",
            metrics=list(STATUS_KEYS),
            groupby=wr.Config(key),
            groupby_aggfunc="sum",
        )
        for key in ("kernel", "cp")
    ]
    return _section("Status counts", bars)


def build_workspace(
    sweep: Path, entity: str, project: str, *, name: str | None = None, mask: str | None = None
) -> Workspace:
    """The standard workspace of ``sweep``'s W&B group, or of one ``mask`` (built, not saved).

    ValueError: see `read_sweep`, or ``mask`` is not one of the sweep's.
    """
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces.utils.validators import validate_no_emoji

    runs = read_sweep(sweep)
    if mask is not None and runs.masks and mask not in runs.masks:
        raise ValueError(f"{sweep}: no mask {mask!r} in this sweep (its masks: {runs.masks})")
    wanted = [ws.Metric("Group") == runs.group]
    if mask is not None:
        wanted.append(ws.Config("mask") == mask)
    pair = ("fwd_tflops", "bwd_tflops")
    sections = [
        _by("kernel", "TFLOP/s per GPU by kernel", pair),
        _by("cp", "TFLOP/s per GPU by CP strategy", pair),
    ]
    if mask is None and len(runs.masks) > 1:
        sections.append(_by("mask", "TFLOP/s per GPU by mask", pair))
    sections += [
        _scaling(),
        _planned(),
        _by("kernel", "Peak memory (MiB)", ("fwd_mem_peak_mib", "bwd_mem_peak_mib")),
        _by("kernel", "Numerical error", ("fwd_max_abs_err", "bwd_max_abs_err"), log_y=True),
        _status(),
    ]
    columns = [f"config:{k}.value" for k in CONFIG_AXES]
    columns += [f"summary:{k}" for k in (*HEADLINE_KEYS, *STATUS_KEYS)]
    title = name or f"lcab {runs.group}" + (f", mask {mask}" if mask else "")
    try:
        validate_no_emoji(title)  # the library's own check, so the message can say what to do
    except ValueError:
        raise ValueError(
            f"workspace name {title!r}: W&B refuses symbol characters in names "
            "(= + < > | $ ^ ` and emoji, Unicode classes S*); pass another --name"
        ) from None
    workspace = ws.Workspace(
        entity=entity,
        project=project,
        name=title,
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis=STEP, max_runs=max(10, runs.cells)),
        runset_settings=ws.RunsetSettings(filters=ws.And(*wanted), pinned_columns=columns),
    )
    _check_filters(workspace, [f.value for f in wanted])
    return workspace


def _check_filters(workspace: Workspace, values: list[str]) -> None:
    """Refuse a workspace whose runset filter would not hold exactly ``values``.

    wandb-workspaces writes filters as a Python-like string and parses it back, quoting naively
    (a quote fails to parse, a backslash or `` = `` comes back changed): better an error than
    a dashboard of other runs.
    """
    try:
        got = _filter_values(workspace_json(workspace)["spec"]["section"]["runSets"])
    except (SyntaxError, ValueError) as err:
        got = [f"unparsable: {err}"]
    if got != values:
        raise ValueError(
            f"wandb-workspaces cannot filter on {values} (it writes {got}); "
            "use a W&B group (logger.group) without quotes, backslashes or '='"
        )


def _filter_values(node: Any) -> list[Any]:
    """The values of every filter leaf (a dict with ``key``, ``op`` and ``value``) in ``node``."""
    if isinstance(node, dict):
        if {"key", "op", "value"} <= node.keys():
            return [node["value"]]
        return [v for child in node.values() for v in _filter_values(child)]
    if isinstance(node, list):
        return [v for child in node for v in _filter_values(child)]
    return []


def workspace_json(view: Workspace | Any) -> dict[str, Any]:
    """The spec ``save`` uploads (a workspace's or a report's), so a dry run shows the same."""
    model = view._to_model()
    data: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's arguments on ``parser`` (for ``python -m lcab.report``)."""
    parser.add_argument("sweep", type=Path, help="sweep folder (outputs/sweeps/<date>/<time>_<id>)")
    parser.add_argument(
        "--entity",
        default=os.environ.get("WANDB_ENTITY"),
        help="W&B entity (default: $WANDB_ENTITY, else the sweep's logger.entity)",
    )
    parser.add_argument(
        "--project",
        default=None,
        help=f"W&B project (default: the sweep's logger.project, else {DEFAULT_PROJECT})",
    )
    parser.add_argument(
        "--dry-run",
        type=Path,
        metavar="PATH",
        help="write the workspace JSON to PATH instead of saving (offline, no login)",
    )
    parser.add_argument("--name", help="workspace name (default: 'lcab <group>')")
    parser.add_argument("--mask", help="show only this mask's runs (one view per mask)")


def command(args: argparse.Namespace) -> int:
    """Write the workspace (``--dry-run``) or save it: 0, 1 when saving fails, 2 for bad input."""
    try:
        runs = read_sweep(args.sweep)
    except ValueError as err:
        print(f"lcab: {err}", file=sys.stderr)
        return 2
    entity = args.entity or runs.entity
    if not entity:
        print("lcab: no W&B entity: pass --entity or set WANDB_ENTITY", file=sys.stderr)
        return 2
    if runs.logged == 0:
        print(
            f"lcab: note: no cell of {runs.folder} logged to W&B (logger=wandb); "
            "the workspace will show no runs",
            file=sys.stderr,
        )
    project = args.project or runs.project or DEFAULT_PROJECT
    try:
        workspace = build_workspace(args.sweep, entity, project, name=args.name, mask=args.mask)
    except ValueError as err:
        print(f"lcab: {err}", file=sys.stderr)
        return 2
    if args.dry_run is not None:
        args.dry_run.parent.mkdir(parents=True, exist_ok=True)
        args.dry_run.write_text(json.dumps(workspace_json(workspace), indent=2) + "\n")
        print(args.dry_run)
        return 0
    return save(workspace, "the workspace")


def save(view: Any, what: str, dry_run: str = "--dry-run") -> int:
    """Upload ``view`` (a workspace or a report) and print its URL; 1 with one line if not."""
    from lcab.records.loggers import first_line, has_credentials  # imports torch

    if not has_credentials():  # checked first: wandb would prompt, or fail deep in a request
        print(
            f"lcab: saving {what} needs a W&B login: no WANDB_API_KEY and no W&B entry in "
            f"~/.netrc. Run `wandb login` or set WANDB_API_KEY, or use {dry_run} PATH to write "
            "its JSON offline",
            file=sys.stderr,
        )
        return 1
    try:
        url = view.save().url
    except Exception as err:  # network, auth, server: one line, not a traceback
        print(f"lcab: saving {what} to W&B failed ({first_line(err)})", file=sys.stderr)
        return 1
    print(url)
    return 0
