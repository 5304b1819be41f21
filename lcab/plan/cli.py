"""Command line of ``python -m lcab.plan``: Hydra predictions, or the profile held to records.

* ``--check RECORDS [--hardware NAME|FILE] [--where KEY=V1,V2]`` prints predicted vs measured
  per record pass, and the error (`lcab.plan.calibrate`);
* ``--check-memory RECORDS [...]`` prints every measured frontier (``seqlen=frontier``
  records) beside the profile's, how many are within ±25 % and how many are safe (predicted ≤
  measured: the planner's length would have run; `lcab.plan.frontier.check_memory`);
* ``--published [--hardware NAME|FILE]`` compares with the published H100 figures.

``--set KEY=NUMBER`` (repeatable) changes one parameter of the profile first: a what-if.
Fitting a profile to records is the lab tool ``python launchers/plan_fit.py rates|memory``,
which reads records, profile and settings with this module's `record_options`, `records_for`
and `profile_for`, and prints the frontiers with `print_frontier_checks`.

Anything else is the Hydra app (`lcab.plan.app`). Bad input exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from rich.table import Table

from lcab.plan.hardware import Hardware, load_profile
from lcab.records.schema import RunRecord
from lcab.records.sinks import read_records
from lcab.records.table import console

RECORD_COMMANDS = ("--check", "--published", "--check-memory")
FITS = {"--calibrate": "rates", "--calibrate-memory": "memory"}
"""The fits, which ``launchers/plan_fit.py`` runs (the package only checks)."""

#: The opening of ``python -m lcab.plan --help``; the config groups and the composed config
#: follow, as in ``python -m lcab.main --help`` (`lcab.config.help`).
HELP_INTRO = """\
lcab planner: predicts context-parallel cells (kernel x cp x mask x topology) on a hardware
profile at each length, before GPU-hours are spent; -m sweeps comma-separated options.
Same groups as the benchmark; `hardware` picks the profile.

  python -m lcab.plan                       # USP, causal_document, 8x8 H100
  python -m lcab.plan -m topology=2x8,4x8,8x8,12x8 cp=ulysses,ring,ring_allgather,usp,loongtrain
  python -m lcab.plan recommend=true mask=full_document topology=12x8
  python -m lcab.plan --check RECORDS.jsonl [--hardware FILE.yaml] [--where KEY=V1,V2]
  python -m lcab.plan --check-memory FRONTIER_RECORDS.jsonl [--hardware FILE.yaml]
  python -m lcab.plan --published           # against the published H100 figures
  python -m lcab.plan --check x --help      # the flags of the record commands
  python launchers/plan_fit.py rates|memory RECORDS.jsonl --out FILE   # fit a profile
"""


def record_options(parser: argparse.ArgumentParser) -> None:
    """The options every record command shares: the profile, a what-if, the records kept."""
    parser.add_argument("--hardware", help="profile name (conf/hardware) or YAML file")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="keep records whose field KEY is one of the values (repeatable)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=NUMBER",
        help="what-if: change one profile parameter (repeatable), e.g. kernels.fa3.call_us=500",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lcab.plan", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", metavar="RECORDS", help="predicted vs measured per record")
    action.add_argument("--published", action="store_true", help="compare with the H100 table")
    action.add_argument(
        "--check-memory", metavar="RECORDS", help="measured vs predicted frontier per record"
    )
    record_options(parser)
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


def records_for(path: Path, where: list[str]) -> list[RunRecord]:
    """The records of ``path`` whose fields match every ``--where`` clause.

    Raises:
        ValueError: no such file, or a clause that is malformed or names no record field.

    """
    if not path.exists():
        raise ValueError(f"records file {str(path)!r} does not exist")
    records = read_records(path)
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


def profile_for(name: str | None, records: list[RunRecord], settings: list[str]) -> Hardware:
    """The named profile (default: the CPU one for CPU records, else the H100's), with ``--set``."""
    if name is None:
        cpu = all(r.device == "cpu" for r in records)
        name = "cpu_gloo_local" if cpu else "h100_nvlink_ib"
    return with_settings(load_profile(name), settings)


def run(argv: list[str]) -> int:
    """Dispatch ``argv`` (see module docstring); returns the exit code."""
    from lcab.config.help import fast_help_applies, print_help

    if fast_help_applies(argv):  # before torch and Hydra's walk over every config group
        return print_help("plan", argv, intro=HELP_INTRO)
    fit = next((a.split("=")[0] for a in argv if a.split("=")[0] in FITS), None)
    if fit is not None:
        print(
            f"lcab plan: {fit}: fits run as python launchers/plan_fit.py {FITS[fit]} RECORDS "
            f"[--out FILE]; valid here: {', '.join(RECORD_COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    if not any(a.split("=")[0] in RECORD_COMMANDS for a in argv):
        from lcab.plan.app import main

        return main(argv)
    args = _parser().parse_args(argv)  # argparse exits with 2 on bad flags
    try:
        if args.published:
            hardware = with_settings(load_profile(args.hardware or "h100_nvlink_ib"), args.set)
            return _published(hardware)
        path = Path(args.check or args.check_memory)
        records = records_for(path, args.where)
        hardware = profile_for(args.hardware, records, args.set)
        if args.check_memory:
            return _check_memory(records, hardware)
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
    return _check(points, hardware)


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
    out = console()
    out.print(table)
    errors = np.abs([r.error for r in rows])
    out.print(
        f"{len(rows)} passes: median |error| {100 * np.median(errors):.0f} %, max "
        f"{100 * errors.max():.0f} %, within ±30 %: {int((errors <= 0.30).sum())}/{len(rows)}"
    )
    return 0


def _published(hardware: Hardware) -> int:
    from lcab.plan.published import CP_SIZES, compare, ordering_agreement

    rows = compare(hardware)
    out = console()
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
    out.print(table)
    errors = np.abs([r.error for r in rows])
    out.print(
        f"{len(rows)} cells: median |error| {100 * np.median(errors):.0f} %, within ±25 %: "
        f"{int((errors <= 0.25).sum())}/{len(rows)}"
    )
    for (mask, pass_), (agree, total) in ordering_agreement(rows).items():
        out.print(f"ordering {mask} {pass_}: {agree}/{total} strategy pairs as published")
    return 0


def _check_memory(records: list[RunRecord], hardware: Hardware) -> int:
    """``--check-memory``: every frontier record beside the profile's frontier for it.

    Raises:
        ValueError: no record found a frontier under a budget.

    """
    from lcab.plan.frontier import frontier_points

    points = frontier_points(records)
    if not points:
        raise ValueError(
            "no frontier record with a budget and both ends of its bracket "
            "(seqlen=frontier bench.memory_budget_gib=...)"
        )
    print_frontier_checks(points, hardware)
    return 0


def print_frontier_checks(points: list, hardware: Hardware) -> None:
    """Each measured frontier beside ``hardware``'s, how many within ±25 %, how many safe."""
    from lcab.plan.frontier import check_memory, within

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
    screen = console()
    screen.print(table)
    safe = sum(c.safe for c in checks)
    screen.print(
        f"{within(checks)} of {len(checks)} predicted within ±25 % of the measured; "
        f"{safe} of {len(checks)} ({safe / len(checks):.0%}) safe: predicted ≤ measured "
        f"(the predicted frontier would have run; margin {hardware.memory_margin:.0%})"
    )
