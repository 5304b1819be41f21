"""`ShapedSlurmLauncher`: hydra-submitit-launcher, extended so each cell gets its own job shape.

The released launcher submits every job of a sweep with one shape (``topology=2x8,4x8`` would
share nodes). This subclass computes each job's shape (`job_shape`), submits one job array per
distinct shape and returns results in sweep order; the rest is the parent's. A job SLURM ends
or whose rank fails still yields a record per length (`outcome.settle`), so the sweep goes on;
``resume=true`` skips settled cells, and a pre-empted job is requeued with it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from lcab.bench.scheduled import SCHEDULED_RANKS, watch_scheduler_signals
from lcab.cell import Cell
from lcab.config import job_info, resolve_cell
from lcab.launch.outcome import NOT_BUILDABLE, NOT_SUBMITTED, JobEnd, result_can_change, settle
from lcab.launch.refusals import layout_problems
from lcab.launch.shape import JobShape, SlurmSettings, job_shape
from lcab.records.resume import split_done
from lcab.records.sinks import RECORDS_FILE

log = logging.getLogger(__name__)

JOB_FILE = "slurm.json"
"""Written in each job folder at submission: job id, shape, overrides (`python -m lcab.sweep`)."""

#: Launcher keys lcab computes per cell or reads itself (never passed to submitit as given).
_LCAB_KEYS = {"gpus_per_rank", "mem_gb_per_rank", "startup_s", "poll_s", "_target_"}
_SHAPE_KEYS = {"nodes", "tasks_per_node", "gpus_per_node", "mem_gb", "timeout_min", "partition"}


def settings_of(params: dict[str, Any]) -> SlurmSettings:
    """The cluster preset's settings that enter a job's shape."""
    return SlurmSettings(
        partition=params.get("partition"),
        gpus_per_task=int(params.get("gpus_per_rank") or 0),
        cpus_per_task=int(params.get("cpus_per_task") or 1),
        mem_gb_per_task=params.get("mem_gb_per_rank"),
        startup_s=float(params.get("startup_s", 300.0)),
        timeout_min=params.get("timeout_min"),
    )


@dataclass
class PlannedJob:
    """One job of the sweep before submission."""

    index: int
    overrides: list[str]
    cell: Cell
    shape: JobShape
    settled: bool
    impossible: tuple[str, ...] = ()
    """Why the cell cannot be laid out on its topology: not submitted, recorded skipped."""


class ShapedSlurmLauncher(BaseSubmititLauncher):
    """SLURM launcher with one job shape per cell (see module docstring)."""

    _EXECUTOR = "slurm"

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        """On the compute node, in every task: this task is one rank of the cell."""
        os.environ[SCHEDULED_RANKS] = "slurm"
        watch_scheduler_signals()  # a scancel is the scheduler's word, not the cell's error
        return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)

    def checkpoint(self, sweep_overrides: list[str], *args: Any, **kwargs: Any) -> Any:
        """Requeue after pre-emption with ``resume=true``: settled lengths are kept."""
        import submitit

        overrides = [o for o in sweep_overrides if not o.startswith("resume=")]
        return submitit.helpers.DelayedSubmission(
            self, [*overrides, "resume=true"], *args, **kwargs
        )

    # ------------------------------------------------------------------ submitting side
    def plan(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[PlannedJob]:
        """Compose every job, resolve its cell and shape (nothing is submitted)."""
        assert self.config is not None and self.hydra_context is not None
        settings = settings_of(self.params)
        planned = []
        for k, overrides in enumerate(job_overrides):
            index = initial_job_idx + k
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = index
            job = job_info(cfg.hydra, multirun=True)
            cell = resolve_cell(cfg, job)
            settled = False
            if cfg.resume:
                _, todo = split_done(Path(job.output_dir) / RECORDS_FILE, cell.seqlens, cell.config)
                settled = not todo
            impossible = tuple(layout_problems(cell, str(cfg.topology.name)))
            shape = job_shape(cell, settings)
            planned.append(PlannedJob(index, list(overrides), cell, shape, settled, impossible))
        return planned

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        """Submit one job array per shape; every job ends with records and a completed return."""
        import submitit

        assert self.config is not None
        planned = self.plan(job_overrides, initial_job_idx)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        ask_wandb_once(self.config, sweep_dir)
        groups: dict[JobShape, list[PlannedJob]] = {}
        for job in planned:
            if job.settled:
                log.info(f"\t#{job.index} : settled, not submitted ({' '.join(job.overrides)})")
            elif job.impossible:  # no nodes held just to say so: its records are written here
                log.info(f"\t#{job.index} : cannot be built, not submitted: {job.impossible[0]}")
                settle(job.cell, JobEnd("-", NOT_BUILDABLE, "; ".join(job.impossible)))
            else:
                groups.setdefault(job.shape, []).append(job)
        submitted: dict[int, Any] = {}
        _poll_every(float(self.params.get("poll_s", 60.0)), self._EXECUTOR)
        for shape, members in groups.items():
            executor = submitit.AutoExecutor(
                cluster=self._EXECUTOR,
                folder=self.params["submitit_folder"],
                slurm_max_num_timeout=self.params.get("max_num_timeout", 0),
            )
            executor.update_parameters(**self._executor_parameters(shape))
            log.info(f"SLURM jobs of shape {shape.describe()}:")
            args = []
            for job in members:
                log.info(f"\t#{job.index} : {' '.join(job.overrides)}")
                args.append(
                    (
                        job.overrides,
                        "hydra.sweep.dir",
                        job.index,
                        f"job_id_for_{job.index}",
                        Singleton.get_state(),
                    )
                )
            try:
                handles = executor.map_array(self, *zip(*args, strict=True))
            except Exception as err:  # sbatch refused: each cell gets a record saying why
                refusal = JobEnd("-", NOT_SUBMITTED, str(err).strip()[-500:])
                for job in members:
                    settle(job.cell, refusal)
                continue
            for job, handle in zip(members, handles, strict=True):
                submitted[job.index] = handle
                _write_job_file(job, handle.job_id)
        return [self._collect(job, submitted.get(job.index)) for job in planned]

    def _executor_parameters(self, shape: JobShape) -> dict[str, Any]:
        """The preset's sbatch options (prefixed as submitit wants) with the cell's shape."""
        generic = set(OmegaConf.structured(BaseQueueConf).keys())
        skip = _LCAB_KEYS | _SHAPE_KEYS | {"submitit_folder", "max_num_timeout"}
        params = {
            (key if key in generic else f"{self._EXECUTOR}_{key}"): value
            for key, value in self.params.items()
            if key not in skip and value is not None
        }
        # submitit's USR2 warning must come well inside the limit, or a short job would take
        # it for a pre-emption and requeue itself at once
        delay = int(params.get(f"{self._EXECUTOR}_signal_delay_s", 120))
        params[f"{self._EXECUTOR}_signal_delay_s"] = min(delay, max(5, shape.timeout_min * 6))
        return params | shape.executor_parameters()

    def _collect(self, job: PlannedJob, handle: Any) -> JobReturn:
        """Wait for ``handle``; records for whatever it left unsettled; a completed return."""
        ret = JobReturn(overrides=job.overrides, status=JobStatus.COMPLETED)
        ret.working_dir = job.cell.job.output_dir
        if handle is None:  # settled before: nothing was submitted
            return ret
        end: JobEnd | None = None
        handle.wait()  # every task left its result file, or sacct says the job ended
        if not _results_written(handle):
            # submitit would now wait up to 15 s for each missing result file (a shared file
            # system may show it late); pointless when the file could not change the records
            state = handle.get_info(mode="force").get("State", "UNKNOWN").split()[0]
            ended = handle.watcher.is_done(handle.job_id, mode="cache")  # sacct's final word
            silent = JobEnd(str(handle.job_id), state, "no result file", _srun_log(handle))
            if ended and not result_can_change(job.cell, silent):
                end = silent
        if end is None:
            end = self._ended(handle)
            end = JobEnd(end.job_id, end.state, end.detail, _srun_log(handle))
        added = settle(job.cell, end)
        if added:
            log.warning(f"#{job.index}: {added[0].reasons[0]}")
        ret.return_value = {"slurm_job_id": str(handle.job_id), "slurm_state": end.state}
        return ret

    @staticmethod
    def _ended(handle: Any) -> JobEnd:
        """How the job ended, from its tasks' results (waiting for them) and sacct."""
        from submitit.core.utils import UncompletedJobError

        end: JobEnd | None = None
        try:
            results = handle.results()
            first = results[0]
            if getattr(first, "status", JobStatus.COMPLETED) != JobStatus.COMPLETED:
                end = JobEnd(str(handle.job_id), "FAILED", repr(first._return_value)[:300])
        except UncompletedJobError as err:
            state = handle.get_info(mode="force").get("State", "UNKNOWN").split()[0]
            end = JobEnd(str(handle.job_id), state, str(err).strip().splitlines()[0][:300])
        if end is None:
            state = handle.get_info(mode="force").get("State", "COMPLETED").split()[0]
            end = JobEnd(str(handle.job_id), state)
        return end


def _poll_every(poll_s: float, cluster: str) -> None:
    """Cap the wait between two sacct polls at ``poll_s`` for the jobs submitted from now on.

    submitit's watcher backs off up to its ``delay_s`` (600 s); a new watcher caps it.
    """
    if cluster != "slurm":
        return
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

    SlurmJob.watcher = SlurmInfoWatcher(delay_s=max(1, round(poll_s)))


def ask_wandb_once(cfg: DictConfig, sweep_dir: Path) -> None:
    """Ask the W&B server once for the whole sweep, before its jobs would each ask.

    A silent server is noted in the sweep folder, so every job logs offline at once
    (`lcab.records.wandb_reach`); one that answers clears an older note.
    """
    from lcab.records.loggers import has_credentials
    from lcab.records.wandb_reach import forget_unreachable, online_blocker, server_url

    logger = cfg.get("logger")
    if logger is None or logger.get("name") != "wandb":
        return
    mode = logger.get("mode") or os.environ.get("WANDB_MODE") or "offline"
    if mode != "online" or not has_credentials():
        return
    url = server_url()
    forget_unreachable(sweep_dir)  # this launch decides afresh
    why, _ = online_blocker(url, float(logger.get("init_timeout_s", 20.0)), sweep_dir)
    if why is not None:
        log.warning(f"W&B server unreachable ({why}): every job of this sweep logs offline")


def _results_written(handle: Any) -> bool:
    """Whether every task of the job has written its result file (submitit's sub-jobs)."""
    tasks = getattr(handle, "_sub_jobs", None) or [handle]
    return all(task.paths.result_pickle.exists() for task in tasks)


def _srun_log(handle: Any) -> str:
    """The batch script's stderr (srun's own messages land there), or '' if unreadable."""
    try:
        return Path(handle.paths.stderr).read_text(errors="replace")[-20000:]
    except (OSError, AttributeError):
        return ""


def _write_job_file(job: PlannedJob, job_id: str) -> None:
    folder = Path(job.cell.job.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "job_id": str(job_id),
        "index": job.index,
        "overrides": job.overrides,
        "shape": job.shape.to_dict(),
        "seqlens": list(job.cell.seqlens),
    }
    (folder / JOB_FILE).write_text(json.dumps(data, indent=1))


def composed_settings(cfg: DictConfig) -> SlurmSettings:
    """Settings of the launcher in a config composed with its ``hydra`` node."""
    node = OmegaConf.select(cfg, "hydra.launcher")
    params = {
        key: OmegaConf.select(node, key, default=None)
        for key in (
            *("partition", "gpus_per_rank", "cpus_per_task", "mem_gb_per_rank"),
            *("startup_s", "timeout_min"),
        )
    }
    return settings_of({k: v for k, v in params.items() if v is not None})
