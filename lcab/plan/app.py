"""``python -m lcab.plan``: the planner as a Hydra app (same groups as the benchmark + hardware).

One job = one cell at each configured length: it prints the prediction (median of
``bench.mask_samples`` samples) and writes ``<job dir>/plan.jsonl``. A multirun ends with one
table and, over several world sizes, ``plan_tflops.png`` (measured ``records=<file>`` overlaid).
``recommend=true`` ranks every strategy for the cell instead.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich import box
from rich.console import Console
from rich.table import Table
from typing_extensions import override

from lcab.cell import Cell
from lcab.config import CONF_DIR, ConfigError, register_configs, resolve_cell
from lcab.masks.doclens import auto_source
from lcab.plan.hardware import Hardware, from_dict
from lcab.plan.harness import HARNESSES, LCAB, Harness
from lcab.plan.predict import CellPrediction, PlanCell, predict_median
from lcab.plan.recommend import recommend, step_ms
from lcab.records.table import console

PLAN_FILE = "plan.jsonl"
PLOT_FILE = "plan_tflops.png"

register_configs()


def _console() -> Console:
    """The terminal's width, or 120 columns off one (`lcab.records.table.console`)."""
    return console()


def _shared(rows: list[dict[str, Any]], key: str, default: str = "") -> str | None:
    """The value every row has for ``key`` (None: they differ)."""
    values = {str(r.get(key, default)) for r in rows}
    return values.pop() if len(values) == 1 else None


def predictions_table(rows: list[dict[str, Any]], title: str) -> Table:
    """Rich table of prediction rows (`CellPrediction.row`), within 120 columns.

    What every row shares (mask, harness, hardware) is said once in the title; the passes
    share a column each for throughput and time, labelled forward / backward.
    """
    shared = {k: _shared(rows, k, "lcab" if k == "harness" else "") for k in SHARED_KEYS}
    said = [f"{k} {v}" for k, v in shared.items() if v]
    table = Table(title=", ".join([title, *said]), title_justify="left", box=box.SIMPLE_HEAD)
    columns = [k for k in SHARED_KEYS if shared[k] is None] + list(ROW_COLUMNS)
    for name in columns:
        table.add_column(
            HEADERS.get(name, name),
            justify="left" if name in (*SHARED_KEYS, "cp") else "right",
            no_wrap=name in ROW_COLUMNS,
        )
    for r in rows:
        table.add_row(*(_cell(r, name) for name in columns))
    return table


SHARED_KEYS = ("mask", "harness", "hardware")
"""Row fields usually shared by a whole sweep: a column only where rows differ."""
ROW_COLUMNS = ("cp", "seqlen", "world", "layout", "tflops", "time", "split", "inter", "memory")
HEADERS = {
    "seqlen": "tokens",
    "world": "GPUs",
    "layout": "U×R",
    "tflops": "TFLOP/s/GPU\nfwd / bwd",
    "time": "ms\nfwd / bwd",
    "split": "fwd ms: compute\n/comm/imbalance",
    "inter": "inter-node\nMB",
    "memory": "mem\nMiB",
}


def _cell(r: dict[str, Any], name: str) -> str:
    """One cell of `predictions_table` (3 significant digits; CPU rates like 0.0353 too)."""
    if name == "layout":
        return f"{r['ulysses']}x{r['ring']}" + (f"/{r['windows']}w" if r["windows"] > 1 else "")
    if name == "tflops":
        return f"{r['fwd_tflops']:.3g} / {r['bwd_tflops']:.3g}"
    if name == "time":
        return f"{_ms(r['fwd_time_ms'])} / {_ms(r['bwd_time_ms'])}"
    if name == "split":
        parts = (r["fwd_compute_ms"], r["fwd_comm_ms"], r["fwd_imbalance_ms"])
        return "/".join(_ms(ms) for ms in parts)
    if name == "inter":
        return f"{(r['fwd_inter_bytes'] + r['bwd_inter_bytes']) / 1e6:,.0f}"
    if name == "memory":
        return f"{r['memory_mib']:,.0f}"
    value = r.get(name, "lcab" if name == "harness" else "")
    return f"{value:,}" if isinstance(value, int) else str(value)


def _ms(ms: float) -> str:
    """Milliseconds in 3 significant digits, whole above 1000 (no exponent)."""
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.3g}"


def hardware_of(cfg: DictConfig) -> Hardware:
    """The composed hardware node as a `Hardware` (ConfigError on a malformed profile)."""
    data = OmegaConf.to_container(cfg.hardware, resolve=True)
    try:
        assert isinstance(data, dict)
        return from_dict({str(k): v for k, v in data.items()})
    except (TypeError, KeyError, AssertionError) as err:
        raise ConfigError(
            "hardware", cfg.hardware.get("name"), f"malformed profile: {err}"
        ) from err


def harness_of(cfg: DictConfig) -> Harness:
    """The configured implementation harness (ConfigError names the valid ones)."""
    name = str(cfg.get("harness", "lcab"))
    if name not in HARNESSES:
        raise ConfigError("harness", name, f"valid: {', '.join(sorted(HARNESSES))}")
    return HARNESSES[name]


def assumed(cell: PlanCell, hardware: Hardware, samples: int) -> str:
    """What a recommendation assumed: kernel, problem, mask and its documents, world, profile.

    The same command ranked Ulysses first with the default documents and Ring All-Gather with
    ``mask.doc_source=long``: an answer that does not say its assumptions misleads.
    """
    source = cell.mask_params.get("doc_source")
    if source == "auto":
        source = f"auto, i.e. {auto_source(cell.seqlen)} at this length"
    documents = f" (doc_source={source})" if source else ""
    device = "GPU" if hardware.device == "cuda" else "rank"
    return (
        f"recommendation assuming kernel {cell.kernel}, {cell.dtype} {cell.heads_q}:"
        f"{cell.heads_kv} heads x {cell.head_dim}, mask {cell.mask}{documents}, "
        f"S={cell.seqlen:,} ({cell.seqlen // cell.world:,} per {device}) on "
        f"{cell.nodes}x{cell.devices_per_node} {device}s, hardware profile {hardware.name} "
        f"(median of {samples} mask sample{'s' if samples > 1 else ''})"
    )


def print_recommendation(
    cell: PlanCell, hardware: Hardware, samples: int = 1, harness: Harness = LCAB
) -> None:
    """Rank the candidates of ``cell`` over ``samples`` mask samples and print the answer."""
    answer = recommend(cell, hardware, samples, harness)
    console = _console()
    if not answer.ranked:
        console.print(f"no strategy can run {cell.label()}")
        return
    console.print(assumed(cell, hardware, samples), markup=False, highlight=False)
    table = Table(title="candidates, fastest first")
    for name in (
        "rank",
        "cp",
        "balance",
        "U x R",
        "fwd+bwd ms",
        "vs best",
        "fwd TFLOP/s/GPU",
        "bwd TFLOP/s/GPU",
        "mem MiB",
    ):
        table.add_column(name)
    best = step_ms(answer.ranked[0])
    for i, p in enumerate(answer.ranked[:12], 1):
        table.add_row(
            str(i),
            p.cell.cp,
            p.balancer,
            f"{p.ulysses}x{p.ring}",
            f"{step_ms(p):.2f}",
            f"+{100 * (step_ms(p) / best - 1):.0f}%",
            f"{p.fwd.tflops:.0f}",
            f"{p.bwd.tflops:.0f}",
            f"{p.memory_mib:.0f}",
        )
    console.print(table)
    top = answer.ranked[0]
    degree = f", Ulysses degree {top.ulysses}" if top.ulysses > 1 else ""
    console.print(
        f"best: {top.cell.cp} (balance={top.balancer}{degree}), predicted "
        f"{100 * answer.margin:.0f}% faster than the runner-up ({answer.ranked[1].cell.cp}, "
        f"balance={answer.ranked[1].balancer})"
        if len(answer.ranked) > 1
        else f"best: {top.cell.cp}"
    )
    nodes, margin = answer.smallest_fitting_nodes, hardware.memory_margin
    console.print(
        f"smallest world whose attention memory fits {hardware.memory_gib:g} GiB per device"
        + (f" less the profile's {margin:.0%} margin: " if margin else ": ")
        + (f"{nodes} node(s) x {cell.devices_per_node}" if nodes else "none up to this topology")
    )


@hydra.main(config_path=str(CONF_DIR), config_name="plan", version_base="1.3")
def app(cfg: DictConfig) -> None:
    """Predict (or recommend for) one cell at each configured length."""
    try:
        cell = resolve_cell(cfg)
        hardware = hardware_of(cfg)
        harness = harness_of(cfg)
    except ConfigError as err:
        print(f"lcab: {err}", file=sys.stderr)
        sys.exit(2)
    origin = hardware.rate_origin(cell.kernel)
    if origin is not None:
        print(
            f"lcab plan: note: {origin} (own rates: {', '.join(hardware.kernels)}). Fit one "
            "with `python launchers/plan_fit.py rates` on that kernel's records.",
            file=sys.stderr,
        )
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    if cell.frontier is not None:
        _frontier_job(cell, hardware, out_dir)
        return
    rows = []
    for seqlen in cell.seqlens:
        target = PlanCell.of_cell(cell, seqlen)
        if cfg.recommend:
            print_recommendation(target, hardware, cell.mask_samples, harness)
            continue
        key = _ahead_key(target, hardware, cell.mask_samples, harness)
        try:
            prediction = _AHEAD.pop(key, None) or predict_median(
                target, hardware, cell.mask_samples, harness
            )
        except ValueError as err:
            print(f"lcab plan: skipped: {err}", file=sys.stderr)
            continue
        extra = {"hardware": hardware.name, "harness": harness.name, "samples": cell.mask_samples}
        rows.append(prediction.row() | extra)
    if rows:
        log = logging.getLogger("lcab.plan")  # the job's app.log
        with (out_dir / PLAN_FILE).open("w") as fh:  # a job run again replaces its rows
            for row in rows:
                fh.write(json.dumps(row) + "\n")
                log.info("%s", json.dumps(row))
        if HydraConfig.get().mode != RunMode.MULTIRUN:  # a sweep ends with one table of all
            _console().print(predictions_table(rows, "plan"))
            print(f"[lcab] rows -> {out_dir / PLAN_FILE}")


def _frontier_job(cell: Cell, hardware: Hardware, out_dir: Path) -> None:
    """``seqlen=frontier``: the model's longest length within the budget (`lcab.plan.frontier`)."""
    from lcab.plan.frontier import predict_cell_frontier

    try:
        found = predict_cell_frontier(cell, hardware)
    except ValueError as err:
        print(f"lcab plan: skipped: {err}", file=sys.stderr)
        return
    row = found.row() | {"hardware": hardware.name, "passes": "+".join(cell.bench.passes)}
    (out_dir / PLAN_FILE).write_text(json.dumps(row) + "\n")
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        _console().print(frontier_table([row], "memory frontier"))


def frontier_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The predicted frontiers: per cell, tokens per device and in all, memory, budget."""
    said = [f"{k} {v}" for k in ("mask", "hardware", "passes") if (v := _shared(rows, k))]
    table = Table(title=", ".join([title, *said]), title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("cp", "kernel", "layout", "tokens/GPU", "tokens", "mem MiB/GPU", "budget GiB"):
        table.add_column(name, justify="left" if name in ("cp", "kernel") else "right")
    for r in sorted(rows, key=lambda r: (r["cp"], r["world"])):
        per_device = r["frontier_tokens_per_device"]
        table.add_row(
            r["cp"],
            r["kernel"],
            r["layout"],
            "-" if per_device is None else f"{per_device:,}",
            "-" if r["frontier_tokens"] is None else f"{r['frontier_tokens']:,}",
            "-" if r["frontier_memory_mib"] is None else f"{r['frontier_memory_mib']:,.0f}",
            f"{r['budget_gib']:g}",
        )
    return table


def read_plan_rows(root: Path, since: float | None = None) -> list[dict[str, Any]]:
    """Every prediction row written under ``root`` (only files written at or after ``since``).

    A sweep directory given again by hand (``hydra.sweep.dir=...``) still holds the job folders
    of earlier sweeps; ``since`` keeps a multirun's table to its own jobs.
    """
    rows = []
    for path in sorted(root.rglob(PLAN_FILE)):
        if since is not None and path.stat().st_mtime < since:
            continue
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


class PlanSummary(Callback):
    """At the end of a multirun: one table of its jobs, and the TFLOP/s-vs-world plot."""

    started: float | None = None

    @override
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()

    @override
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        rows = read_plan_rows(root, since=self.started)
        if not rows:
            return
        if all("frontier_tokens" in r for r in rows):
            _console().print(frontier_table(rows, f"memory frontier of {len(rows)} cells"))
            print(f"[lcab] each cell's row: {root}/*/{PLAN_FILE}")
            return
        rows.sort(key=lambda r: (r["mask"], r["cp"], r["world"]))
        _console().print(predictions_table(rows, f"plan of {len(rows)} cells"))
        print(f"[lcab] each cell's rows: {root}/*/{PLAN_FILE}")
        if len({r["world"] for r in rows}) > 1:
            from lcab.plan.figure import plot_scaling

            drawn = plot_scaling(rows, root / PLOT_FILE, config.get("records"))
            print(f"[lcab] plot -> {drawn}")


_AHEAD: dict[str, CellPrediction] = {}
"""Predictions the pre-flight made for the jobs Hydra is about to run (`PredictAhead`)."""


def _ahead_key(cell: PlanCell, hardware: Hardware, samples: int, harness: Harness) -> str:
    """What a prediction depends on, as text (the dataclasses hold dicts: not hashable)."""
    return repr((cell, hardware, samples, harness.name))


class PredictAhead:
    """Each job's predictions, made by the pre-flight on every core (`lcab.config.fork_map`).

    Hydra's launcher runs the jobs one after another; the pre-flight holds every job's config.
    A job's `app` prints the prediction made here, and makes anything not made here itself.
    """

    def prepare(self, cfg: DictConfig, cell: Cell) -> dict[str, CellPrediction] | None:
        """Every length's prediction of the job (None for recommendations and bad profiles)."""
        if cfg.get("recommend") or cell.frontier is not None:
            return None
        try:
            hardware, harness = hardware_of(cfg), harness_of(cfg)
        except ConfigError:
            return None
        made = {}
        for seqlen in cell.seqlens:
            target = PlanCell.of_cell(cell, seqlen)
            try:
                prediction = predict_median(target, hardware, cell.mask_samples, harness)
            except ValueError:
                continue  # the job says why when it runs
            made[_ahead_key(target, hardware, cell.mask_samples, harness)] = prediction
        return made

    def adopt(self, value: dict[str, CellPrediction]) -> None:
        """Keep one job's predictions for its `app`."""
        _AHEAD.update(value)


def main(argv: list[str]) -> int:
    """Pre-check every job (exit 2 on bad input) and predict it on every core, then run Hydra."""
    from lcab.config.fork_map import usable_cores
    from lcab.config.preflight import preflight, split_argv

    multirun = split_argv(argv)[1]
    code = preflight(
        argv,
        config_name="plan",
        ahead=PredictAhead() if multirun else None,
        workers=usable_cores() if multirun else 1,
    )
    if code:
        return code
    sys.argv = [sys.argv[0], *argv]
    app()
    return 0


__all__ = ["CellPrediction", "app", "main", "predictions_table", "read_plan_rows"]
