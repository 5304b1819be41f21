"""`WandbLogger`: one W&B run per cell, made for comparing cells in the runs table and charts.

Group = the dated sweep, name = the cell's own overrides, tags = its axes; ``resume=true``
continues the same run id. History has one step per length (``seqlen`` the step metric); the
summary holds per-length values and a *named* headline (the largest ``ok`` length), never a
last-length value an earlier failure could mislabel. W&B's data and cache folders go inside the
run folder unless set, so nothing goes to ``$HOME``. What each part holds: the W&B section of
lcab/records/README.md. W&B trouble never costs a record: see `lcab.records.loggers`.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Literal, cast

import torch
from omegaconf import DictConfig
from typing_extensions import override

import lcab
from lcab.cell import Cell
from lcab.records.artifacts import TRACES_DIR, mask_pictures, trace_files
from lcab.records.logging_base import RecordLogger, first_line, has_credentials
from lcab.records.schema import STATUSES, RunRecord
from lcab.records.sinks import CSV_FILE, RECORDS_FILE, read_records, write_csv
from lcab.records.summary import WANDB_RUN_ID_FILE
from lcab.records.wandb_reach import online_blocker, server_url

_USER_DIRS = {key: os.environ.get(key) for key in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR")}
"""W&B's data and cache folders as the user set them; where unset, lcab keeps them in the run
folder (artifact staging per cell; the W&B service's logs, one service per process, per sweep)."""
#: Overrides that change how a run is reported or launched, not what it measures (a key is one
#: of them when it starts with one: ``logger.mode``, ``bench.profile_reps``).
REPORTING_KEYS = (
    *("logger", "debug", "resume", "dry_run", "hydra", "launcher"),
    *("bench.progress", "bench.profile", "bench.telemetry"),
)
#: Record fields of the environment, added to the run's config with the first record.
ENVIRONMENT = (
    *("git_sha", "git_dirty", "device_name", "cuda_version", "hostname", "slurm_job_id"),
    *("slurm_nodelist", "num_threads", "python_version", "torch_build", "cudnn_version"),
    *("driver_version", "kernel_package_version", "kernel_binary"),
)
#: Per-length values copied into the summary under ``<name>/<seqlen>``.
SUMMARY_METRICS = tuple(
    f"{pass_}_{metric}"
    for metric in (
        *("ms_p50", "tflops", "mem_peak_mib", "max_abs_err"),
        *("predicted_tflops", "predicted_ratio"),  # the planner's (lcab.plan.record_prediction)
        *("clock_mhz_median", "power_w", "energy_j_per_token"),  # lcab.bench.telemetry
        "peak_share",  # of the device's peak at the measured clock (lcab.peaks)
    )
    for pass_ in ("fwd", "bwd")
)
#: A frontier cell's result (``seqlen=frontier``, `lcab.bench.frontier`), under ``frontier/<name>``.
FRONTIER_METRICS = (
    *("frontier_tokens", "frontier_tokens_per_device", "frontier_peak_mib"),
    *("frontier_bytes_per_token", "frontier_budget_gib"),
    *("frontier_predicted_tokens", "frontier_predicted_ratio"),  # lcab.plan.frontier's
)
FAILED = ("error", "timeout", "oom", "numerics_mismatch")
"""Statuses that count as a failed length (a capability ``skipped`` does not)."""
#: Every records-table column, in record order (the same for every run).
TABLE_COLUMNS = tuple(RunRecord().flat())


def run_name(cell: Cell) -> str:
    """The cell's own overrides without reporting keys; kernel/cp/mask when it has none."""
    kept = [
        o
        for o in cell.job.overrides
        if not o.lstrip("+~").split("=", 1)[0].startswith(REPORTING_KEYS)
    ]
    return ",".join(sorted(kept)) or f"{cell.kernel}/{cell.cp}/{cell.mask}"


def group_of_folder(sweep_or_run: Path) -> str:
    """The W&B group of a sweep (or single-run) folder: ``<date>_<time>_<id>``."""
    folder = Path(sweep_or_run).resolve()
    return f"{folder.parent.name}_{folder.name}"


def run_group(cell: Cell) -> str:
    """The sweep, dated: ``<date>_<time>_<id>`` from the sweep (or run) folder."""
    folder = Path(cell.job.output_dir)
    return group_of_folder(folder.parent if cell.job.job_num is not None else folder)


def run_config(cell: Cell, versions: dict[str, Any]) -> dict[str, Any]:
    """What ran, resolved (no ``auto``/``null`` left where lcab decided)."""
    return {
        "kernel": cell.kernel,
        "kernel_options": cell.kernel_options,
        "cp": cell.cp,
        "cp_options": cell.cp_options,
        "mask": cell.mask,
        "mask_params": cell.mask_params,
        "seqlens": list(cell.seqlens),
        "heads_q": cell.heads_q,
        "heads_kv": cell.heads_kv,
        "head_dim": cell.head_dim,
        "dtype": cell.dtype,
        "device": cell.device,
        "world_size": cell.world_size,
        "nodes": cell.nodes,
        "devices_per_node": cell.devices_per_node,
        "backend": cell.backend,
        "topology": cell.config.get("topology", {}).get("name"),
        "bench": dict(vars(cell.bench)),
        "overrides": list(cell.job.overrides),
        "sweep_id": cell.job.sweep_id,
        **versions,
    }


def _cell_value(value: Any) -> Any:
    """A records-table cell: numbers and strings as they are, anything else as JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, default=str, sort_keys=True)


class WandbLogger(RecordLogger):
    """One W&B run per cell, rank 0 only; ``quiet`` (lcab's table says what W&B would print)."""

    def __init__(self, cfg: DictConfig, cell: Cell) -> None:
        import wandb

        self._wandb = wandb
        self.cell = cell
        self.records: list[RunRecord] = []
        self._logged: set[str] = set()
        self._broken = False
        job_dir = Path(cell.job.output_dir)
        job_dir.mkdir(parents=True, exist_ok=True)
        self.job_dir = job_dir
        sweep_dir = job_dir.parent if cell.job.job_num is not None else job_dir
        for key, where in (("WANDB_DATA_DIR", job_dir), ("WANDB_CACHE_DIR", sweep_dir)):
            if _USER_DIRS[key] is None:  # per cell: a multirun process runs many cells
                os.environ[key] = str(where / "wandb" / key.split("_")[1].lower())
        id_file = job_dir / WANDB_RUN_ID_FILE  # resume=true continues that run
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        versions = {"lcab_version": lcab.__version__, "torch_version": torch.__version__}
        init: dict[str, Any] = {
            "project": cfg.logger.project,
            "entity": cfg.logger.entity,
            "group": cfg.logger.group or run_group(cell),
            "name": run_name(cell),
            "job_type": "bench",
            "tags": [
                cell.kernel,
                cell.cp,
                cell.mask,
                str(run_config(cell, {})["topology"]),
                f"world{cell.world_size}",
                cell.dtype,
                cell.device,
                *cfg.logger.tags,
            ],
            "config": run_config(cell, versions),
            "dir": str(job_dir),
            "id": run_id,
            "resume": "allow",
            "reinit": "finish_previous",
        }
        mode = cfg.logger.mode or os.environ.get("WANDB_MODE") or "offline"
        self.run: Any = None
        if mode == "online":
            self.run = self._start_online(
                cfg, init, sweep_dir if cell.job.job_num is not None else None
            )
            mode = "offline"  # unless it started
        if self.run is None:
            if mode not in ("offline", "disabled"):
                raise ValueError(f"logger.mode={mode!r} is invalid: online, offline or disabled")
            # W&B's own analytics would otherwise contact the server at exit (10 s when it hangs)
            wandb.setup(wandb.Settings(mode=cast(Literal["offline", "disabled"], mode)))
            self.run = wandb.init(
                mode=cast(Literal["offline", "disabled"], mode),
                settings=wandb.Settings(quiet=True),
                **init,
            )
        self.run.define_metric("seqlen")
        self.run.define_metric("*", step_metric="seqlen")

    def _start_online(self, cfg: DictConfig, init: dict[str, Any], sweep: Path | None) -> Any:
        """An online run, or None after one line saying why not (the caller logs offline).

        Asks the server first (`lcab.records.wandb_reach`): a silent one costs at most
        ``logger.init_timeout_s`` once per sweep. A failed start's service is torn down.
        """
        wandb, timeout = self._wandb, float(cfg.logger.init_timeout_s)
        url = server_url()
        why = None if has_credentials() else "no API key (set WANDB_API_KEY or `wandb login`)"
        if why is None:
            why, known = online_blocker(url, timeout, sweep)
            if known:
                why = f"{why}; known from earlier in this sweep"
        if why is None:
            try:
                settings = wandb.Settings(init_timeout=timeout, quiet=True)
                return wandb.init(mode="online", settings=settings, **init)
            except Exception as err:  # auth, network, time-out: all mean "not now"
                why = first_line(err)
                wandb.teardown()  # frees the run id the failed start still holds
        print(
            f"lcab: W&B online unavailable ({why}); logging offline in {self.job_dir}/wandb "
            f"- upload later with: wandb sync {self.job_dir}/wandb/offline-run-*",
            file=sys.stderr,
        )
        return None

    @override
    def log(self, record: RunRecord) -> None:
        if self._broken:
            return
        self.records.append(record)
        try:
            if len(self.records) == 1:  # the environment the records say they ran in
                env = {k: getattr(record, k) for k in ENVIRONMENT}
                self.run.config.update(env, allow_val_change=True)
            flat = record.measured_flat()  # ranks that shared a GPU: no times, no TFLOP/s
            row: dict[str, Any] = {
                k: v
                for k, v in flat.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            row["status"] = record.status
            row["status_ok"] = int(record.status == "ok")
            self._logged |= set(row) - {"seqlen"}
            self.run.log(row)
        except Exception as err:
            self._give_up(err)

    def _summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = {}
        counts = Counter(r.status for r in self.records)
        summary["status_counts"] = dict(counts)
        for status in STATUSES:
            summary[f"n_{status}"] = counts.get(status, 0)
        for r in self.records:
            flat = r.measured_flat()
            summary[f"status/{r.seqlen}"] = r.status
            if r.prediction_warning:
                summary[f"prediction_warning/{r.seqlen}"] = r.prediction_warning
            for name in SUMMARY_METRICS:
                if flat.get(name) is not None:
                    summary[f"{name}/{r.seqlen}"] = flat[name]
        summary["n_prediction_warnings"] = sum(bool(r.prediction_warning) for r in self.records)
        searched = [r for r in self.records if r.frontier_tokens is not None]
        if searched:  # one search per cell: its record holds the frontier and the bracket
            frontier = searched[-1].flat()
            for name in FRONTIER_METRICS:
                if frontier.get(name) is not None:
                    summary[f"frontier/{name.removeprefix('frontier_')}"] = frontier[name]
        ok = [r for r in self.records if r.status == "ok"]
        if ok:
            head = max(ok, key=lambda r: r.seqlen).measured_flat()
            summary["headline/seqlen"] = head["seqlen"]
            for name in SUMMARY_METRICS:
                summary[f"headline/{name}"] = head.get(name)
        return summary

    @override
    def close(self, failed: bool = False) -> None:
        if not self._broken:
            try:
                table = self._wandb.Table(
                    columns=list(TABLE_COLUMNS),
                    data=[
                        [_cell_value(r.measured_flat()[c]) for c in TABLE_COLUMNS]
                        for r in self.records
                    ],
                )
                self.run.summary["records"] = table  # a summary value: no extra history step
                present = set(self.run.summary.keys())
                for key in self._logged & present:  # W&B's summary is the last step: drop it
                    del self.run.summary[key]
                for key, value in self._summary().items():
                    self.run.summary[key] = value
                self._log_artifacts()
            except Exception as err:
                self._give_up(err)
        all_failed = bool(self.records) and all(r.status in FAILED for r in self.records)
        try:
            self.run.finish(exit_code=1 if failed or all_failed else 0)
        except Exception as err:
            self._give_up(err)

    def _log_artifacts(self) -> None:
        """The job's records, mask picture and traces (see the module docstring)."""
        wandb, run, job_dir = self._wandb, self.run, self.job_dir
        jsonl = job_dir / RECORDS_FILE
        records = wandb.Artifact(f"lcab-records-{run.id}", type="lcab-records")
        if jsonl.exists():  # the whole job's records: kept ones of a resumed job too
            records.add_file(str(jsonl), name=RECORDS_FILE)
            csv = write_csv(read_records(jsonl), job_dir / CSV_FILE)
            records.add_file(str(csv), name=CSV_FILE)
        pictures = mask_pictures(job_dir)
        if pictures:
            records.add_file(str(pictures[-1]), name=pictures[-1].name)
            seqlen = pictures[-1].stem.rsplit("S", 1)[-1]
            run.summary["mask"] = wandb.Image(
                str(pictures[-1]), caption=f"{self.cell.mask}, S={seqlen}"
            )
        run.log_artifact(records)
        traces = trace_files(job_dir)
        if traces:
            artifact = wandb.Artifact(f"lcab-trace-{run.id}", type="lcab-trace")
            for path in traces:  # immutable: written once, not copied into staging
                artifact.add_file(str(path), name=f"{TRACES_DIR}/{path.name}", policy="immutable")
            run.log_artifact(artifact)

    def _give_up(self, err: BaseException) -> None:
        if not self._broken:
            print(
                f"lcab: W&B logging stopped ({first_line(err)}); records unaffected",
                file=sys.stderr,
            )
        self._broken = True
