"""Command line of ``python -m lcab.plan``: Hydra predictions, or one of the record commands.

* ``--calibrate RECORDS [--hardware NAME|FILE] [--where KEY=V1,V2] [--out FILE]`` fits the
  profile's free parameters to the measured passes and writes the fitted profile (YAML);
* ``--check RECORDS [--hardware NAME|FILE] [--where ...]`` prints predicted vs measured per
  record pass, and the error;
* ``--published [--hardware NAME|FILE]`` compares with the published H100 figures;
* ``--calibrate-memory RECORDS [--where ...] [--out FILE]`` fits the kernels' memory terms to
  measured frontiers (``seqlen=frontier`` records) and prints each frontier beside the fitted
  model's; ``--check-memory RECORDS`` prints them beside the profile's as it is
  (`lcab.plan.calibrate_memory`).

``--set KEY=NUMBER`` (repeatable) changes one parameter of the profile first: a what-if.

Anything else is the Hydra app (`lcab.plan.app`). Bad input exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from lcab.plan.hardware import Hardware, load_profile
from lcab.records.schema import RunRecord
from lcab.records.sinks import read_records
from lcab.records.table import console

RECORD_COMMANDS = ("--calibrate", "--check", "--published", "--calibrate-memory", "--check-memory")

#: The opening of ``python -m lcab.plan --help``; the config groups and the composed config
#: follow, as in ``python -m lcab.main --help`` (`lcab.config.help`).
HELP_INTRO = """\
lcab planner: predicts context-parallel cells (kernel x cp x mask x topology) on a hardware
profile at each length, before GPU-hours are spent; -m sweeps comma-separated options.
Same groups as the benchmark; `hardware` picks the profile.

  python -m lcab.plan                       # USP, causal_document, 8x8 H100
  python -m lcab.plan -m topology=2x8,4x8,8x8,12x8 cp=ulysses,ring,ring_allgather,usp,loongtrain
  python -m lcab.plan recommend=true mask=full_document topology=12x8
  python -m lcab.plan --calibrate RECORDS.jsonl [--hardware NAME] [--kernels-only] [--out FILE]
  python -m lcab.plan --check RECORDS.jsonl [--hardware FILE.yaml]
  python -m lcab.plan --published           # against the published H100 figures
  python -m lcab.plan --calibrate-memory FRONTIER_RECORDS.jsonl [--out FILE]
  python -m lcab.plan --calibrate x --help  # the flags of the record commands
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lcab.plan", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--calibrate", metavar="RECORDS", help="fit the profile to these records")
    action.add_argument("--check", metavar="RECORDS", help="predicted vs measured per record")
    action.add_argument("--published", action="store_true", help="compare with the H100 table")
    action.add_argument(
        "--calibrate-memory", metavar="RECORDS", help="fit the memory terms to frontier records"
    )
    action.add_argument(
        "--check-memory", metavar="RECORDS", help="measured vs predicted frontier per record"
    )
    parser.add_argument("--hardware", help="profile name (conf/hardware) or YAML file")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="keep records whose field KEY is one of the values (repeatable)",
    )
    parser.add_argument("--out", help="where --calibrate writes the fitted profile (YAML)")
    parser.add_argument(
        "--kernels-only",
        action="store_true",
        help="--calibrate fits the kernels' rates only (links and memory stay as they are)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=NUMBER",
        help="what-if: change one profile parameter (repeatable), e.g. kernels.fa3.call_us=500",
    )
    return parser


def with_settings(hardware: Hardware, settings: list[str]) -> Hardware:
    """``hardware`` with each ``KEY=NUMBER`` of ``--set`` applied, its name saying so.

    Raises:
        ValueError: a malformed setting or an unknown key (the message names the valid keys).

    """
    if not settings:
        return hardware
    values = {}
    for clause in settings:
        key, _, raw = clause.partition("=")
        try:
            values[key] = float(raw)
        except ValueError:
            raise ValueError(
                f"--set {clause!r}: expected KEY=NUMBER, e.g. kernels.fa3.call_us=500"
            ) from None
    try:
        changed = hardware.with_values(values)
    except KeyError as err:
        raise ValueError(f"--set: {err.args[0]}") from None
    return dataclasses.replace(changed, name=f"{hardware.name} with {' '.join(settings)}")


#: The record fields a ``--where`` usually selects on (any field of `RunRecord` works).
WHERE_FIELDS = (
    "cp, mask, world_size, kernel, seqlen, nodes, devices_per_node, heads_q, heads_kv, "
    "head_dim, dtype, device, sweep_id, git_sha, hostname"
)


def _filter(records: list[RunRecord], where: list[str]) -> list[RunRecord]:
    for clause in where:
        key, _, values = clause.partition("=")
        if not values:
            raise ValueError(f"--where {clause!r}: expected FIELD=V1,V2 (e.g. world_size=2,4)")
        if not hasattr(RunRecord(), key):
            raise ValueError(
                f"--where {clause!r}: {key!r} is no record field; valid: {WHERE_FIELDS} "
                "(any field of lcab.records.schema.RunRecord)"
            )
        wanted = set(values.split(","))
        records = [r for r in records if str(getattr(r, key)) in wanted]
    return records


def _hardware(name: str | None, records: list[RunRecord]) -> Hardware:
    if name is None:
        cpu = all(r.device == "cpu" for r in records)
        name = "cpu_gloo_local" if cpu else "h100_nvlink_ib"
    return load_profile(name)


def run(argv: list[str]) -> int:
    """Dispatch ``argv`` (see module docstring); returns the exit code."""
    from lcab.config.help import fast_help_applies, print_help

    if fast_help_applies(argv):  # before torch and Hydra's walk over every config group
        return print_help("plan", argv, intro=HELP_INTRO)
    if not any(a.split("=")[0] in RECORD_COMMANDS for a in argv):
        from lcab.plan.app import main

        return main(argv)
    args = _parser().parse_args(argv)  # argparse exits with 2 on bad flags
    try:
        if args.published:
            hardware = with_settings(load_profile(args.hardware or "h100_nvlink_ib"), args.set)
            return _published(hardware)
        path = Path(args.calibrate or args.check or args.calibrate_memory or args.check_memory)
        if not path.exists():
            raise ValueError(f"records file {str(path)!r} does not exist")
        records = _filter(read_records(path), args.where)
        hardware = with_settings(_hardware(args.hardware, records), args.set)
        if args.calibrate_memory or args.check_memory:
            from lcab.plan.memory_cli import memory_command

            return memory_command(records, hardware, bool(args.calibrate_memory), args.out)
        from lcab.plan.calibrate import points_of

        points = points_of(records)
        if not points:
            matching = f" matching --where {' '.join(args.where)}" if args.where else ""
            raise ValueError(
                f"{path}: no ok records (kernel runs or context-parallel cells){matching} to use"
            )
    except ValueError as err:
        print(f"lcab plan: {err}", file=sys.stderr)
        return 2
    if args.calibrate:
        return _calibrate(points, hardware, args.out, args.kernels_only)
    return _check(points, hardware)


def _console() -> Console:
    """The terminal's width, or 120 columns off one."""
    return console()


def _calibrate(points: list, hardware: Hardware, out: str | None, kernels_only: bool) -> int:
    from lcab.plan.calibrate import calibrate, free_parameters

    kernels = {p.cell.kernel for p in points}
    names = free_parameters(hardware, kernels, links=False) if kernels_only else None
    fit = calibrate(points, hardware, names)
    console = _console()
    table = Table(title=f"calibrated {hardware.name} on {fit.points} measured passes")
    table.add_column("parameter")
    table.add_column("fitted", justify="right")
    for name, value in fit.parameters.items():
        table.add_row(name, f"{value:.4g}")
    console.print(table)
    console.print(
        f"rms error (log ratio): {fit.rms_log_error:.3f} "
        f"(~{100 * (np.exp(fit.rms_log_error) - 1):.0f} %)"
    )
    text = yaml.safe_dump(fit.hardware.to_dict(), sort_keys=False)
    if out:
        Path(out).write_text(text)
        console.print(f"fitted profile -> {out}")
    else:
        print(text)
    return 0


def _check(points: list, hardware: Hardware) -> int:
    from lcab.plan.calibrate import check

    rows = check(points, hardware)
    table = Table(title=f"predicted vs measured on {hardware.name}")
    for name in ("cell", "pass", "measured ms", "predicted ms", "error"):
        table.add_column(name, justify="left" if name in ("cell", "pass") else "right")
    for r in rows:
        table.add_row(
            r.label,
            r.pass_,
            f"{r.measured_ms:.2f}",
            f"{r.predicted_ms:.2f}",
            f"{100 * r.error:+.0f}%",
        )
    console = _console()
    console.print(table)
    errors = np.abs([r.error for r in rows])
    console.print(
        f"{len(rows)} passes: median |error| {100 * np.median(errors):.0f} %, max "
        f"{100 * errors.max():.0f} %, within ±30 %: {int((errors <= 0.30).sum())}/{len(rows)}"
    )
    return 0


def _published(hardware: Hardware) -> int:
    from lcab.plan.published import CP_SIZES, compare, ordering_agreement

    rows = compare(hardware)
    console = _console()
    table = Table(
        title=f"predicted/published per-GPU TFLOP/s (H100 blog table) on {hardware.name}, "
        "costing the code that was measured (harness=longca)"
    )
    table.add_column("mask / pass")
    table.add_column("strategy")
    for world in CP_SIZES:
        table.add_column(f"cp={world}", justify="right")
    keys = list(dict.fromkeys((r.mask, r.pass_, r.cp) for r in rows))
    for mask, pass_, cp in keys:
        cells = [r for r in rows if (r.mask, r.pass_, r.cp) == (mask, pass_, cp)]
        table.add_row(
            f"{mask} {pass_}",
            cp,
            *(f"{r.predicted:.0f}/{r.published:.0f} {100 * r.error:+.0f}%" for r in cells),
        )
    console.print(table)
    errors = np.abs([r.error for r in rows])
    console.print(
        f"{len(rows)} cells: median |error| {100 * np.median(errors):.0f} %, within ±25 %: "
        f"{int((errors <= 0.25).sum())}/{len(rows)}"
    )
    for (mask, pass_), (agree, total) in ordering_agreement(rows).items():
        console.print(f"ordering {mask} {pass_}: {agree}/{total} strategy pairs as published")
    return 0
