"""Pre-flight: compose and check every job of a run or sweep before anything is launched.

Hydra composes each job of a multirun only when it starts it, so a bad value in the third job
would surface after two jobs ran, and Hydra exits with code 1 for bad input. lcab expands the
sweep itself (Hydra's own override parser and basic-sweeper expansion, including
``hydra.sweeper.params`` presets), composes every job with `hydra.compose` and resolves it with
`resolve_cell`, then prints every problem with the key, value and valid options and exits 2.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hydra import compose, initialize_config_dir

# Private Hydra API on purpose: the sweep must expand exactly as Hydra's basic sweeper will.
# The hydra-core<1.4 pin in pyproject.toml keeps it stable; tests/config cover the expansion.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lcab.cell import Cell
from lcab.config import CONF_DIR, ConfigError, compose_cache, register_configs, resolve_cell
from lcab.config.choices import choice_line, closest, option_keys, options
from lcab.config.fork_map import fork_map

#: Hydra flags after which lcab does not pre-check (help, info, config printing, shell completion).
_PASSTHROUGH = (
    *("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion"),
    *("-sc", "--version", "--resolve", "-p", "--package", "--config-path", "-cp"),
    *("--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"),
)


def job_overrides(
    overrides: list[str], multirun: bool, config_name: str = "config"
) -> list[list[str]]:
    """The overrides of every job the run or sweep would launch (as `hydra_jobs` shows them)."""
    return [shown for shown, _ in hydra_jobs(overrides, multirun, config_name)]


def hydra_jobs(
    overrides: list[str], multirun: bool, config_name: str = "config"
) -> list[tuple[list[str], list[str]]]:
    """(shown, composed) override lists of every job, ``composed`` exactly as Hydra's.

    Hydra reads ``hydra.mode`` from a multirun composition (``Hydra.get_mode``), appending it
    when unset; a sweeper expands the ``hydra.sweeper.params`` preset then the task overrides,
    and its launcher puts the command line's ``hydra`` overrides first. The same lists in the
    same order let `lcab.config.compose_cache` answer Hydra from the pre-flight's compositions;
    ``shown`` is the job as the user wrote it.
    """
    register_configs()
    compose_cache.install()
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    with _hydra():
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        master = hydra.compose_config(  # the very call of Hydra.get_mode
            config_name=config_name,
            overrides=list(overrides),
            with_log_configuration=False,
            run_mode=RunMode.MULTIRUN,
            validate_sweep_overrides=False,
        )
    mode = OmegaConf.select(master, "hydra.mode", default=None)
    suffix = []
    if mode is None:
        suffix = [f"hydra.mode={'MULTIRUN' if multirun else 'RUN'}"]
    elif multirun and mode == RunMode.RUN:
        suffix = ["hydra.mode=MULTIRUN"]
    if not multirun:
        return [(list(overrides), [*overrides, *suffix])]
    params = OmegaConf.select(master, "hydra.sweeper.params", default=None) or {}
    preset = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    hydra_part = [str(o.input_line) for o in parsed if o.is_hydra_override()]
    task = [o for o in parsed if not o.is_hydra_override()]
    batches = BasicSweeper.split_arguments(preset + task, max_batch_size=None)
    return [
        ([*hydra_part, *job], [*hydra_part, *suffix, *job]) for batch in batches for job in batch
    ]


class _hydra:  # noqa: N801  (a context manager used like a function)
    def __enter__(self) -> None:
        GlobalHydra.instance().clear()
        self._ctx = initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
        self._ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)
        GlobalHydra.instance().clear()


def _explain(err: BaseException, job: list[str], config_name: str = "config") -> str:
    """Hydra's message without its search-path listing, plus the cause and valid keys.

    A missing group option (`choice_line`) and a key the option lacks (Hydra suggests
    ``+mask.windw``, a key no code reads) are said lcab's way: the valid keys and the nearest.
    """
    text = str(err).split("\nConfig search path:")[0].strip()
    missing = re.search(r"Could not find '(\w+)/([^']+)'", text)
    if missing and (valid := options(missing.group(1), CONF_DIR)):
        return choice_line(missing.group(1), missing.group(2), valid)
    cause = err.__cause__
    if cause is not None and str(cause).split("\n")[0] not in text:
        text += f" ({str(cause).splitlines()[0]})"
    match = re.search(r"Could not override '([\w.]+)'", text)
    if match and "." in match.group(1):
        key = match.group(1)
        parent, leaf = key.rsplit(".", 1)
        others = [o for o in job if not o.startswith(key + "=")]
        try:
            node = OmegaConf.select(compose(config_name, overrides=others), parent)
            if node is not None and hasattr(node, "keys"):
                keys = [str(k) for k in node]
                value = next((o.split("=", 1)[1] for o in job if o.startswith(f"{key}=")), "...")
                text = _key_line(f"{key}={value}", parent, leaf, keys, node.get("name"))
        except (HydraException, OmegaConfBaseException):
            pass
        group = match.group(1).split(".")[0]
        if any(o.startswith(f"{group}=") and "," in o for o in job):
            # a sweep's overrides are checked against the default group option before each
            # job composes its own; ``++`` sets the key in whichever option the job gets
            text += (
                f"; when a sweep changes {group}, set its options with "
                f"++{match.group(1)}=... (applied to each {group} the sweep composes)"
            )
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _key_line(setting: str, parent: str, leaf: str, keys: list[str], chosen: Any) -> str:
    """``parent`` has no ``leaf``: the options of its group that have it, or the nearest key."""
    others = option_keys(parent, CONF_DIR) if "." not in parent else {}
    having = [option for option, its in others.items() if leaf in its]
    near = closest(leaf, keys) or closest(leaf, sorted({k for its in others.values() for k in its}))
    if having:
        example = min(having, key=len)
        hint = (
            f"it is a setting of {parent}={', '.join(having)} (e.g. {parent}={example} {setting}); "
        )
    elif near and near[0] in keys:
        hint = f"did you mean {parent}.{near[0]}? "
    elif near:
        owners = [option for option, its in others.items() if near[0] in its]
        hint = f"did you mean {parent}.{near[0]} (a setting of {parent}={', '.join(owners)})? "
    else:
        hint = ""
    name = f" {chosen}" if chosen else ""
    return (
        f"{setting}: {parent}{name} has no key {leaf!r}; {hint}valid keys of {parent}{name}: "
        + ", ".join(keys)
    )


JobCheck = Callable[[DictConfig, Cell], list[str]]
"""An extra check of one job: its config (with the ``hydra`` node) and resolved cell."""


_COMPOSED: dict[tuple[str, tuple[str, ...], bool], DictConfig] = {}
"""Configs the pre-flight handed out (read only: the pre-flight and dry run share them)."""


def _compose(config_name: str, overrides: list[str], with_hydra: bool) -> DictConfig:
    """``compose`` once per process for each override list (inside `_hydra`)."""
    key = (config_name, tuple(overrides), with_hydra)
    if key not in _COMPOSED:
        _COMPOSED[key] = compose(config_name, overrides=overrides, return_hydra_config=with_hydra)
    return _COMPOSED[key]


def composed_jobs(overrides: list[str], multirun: bool) -> list[tuple[list[str], DictConfig]]:
    """Every job's overrides and config, composed with its ``hydra`` node (no job runs)."""
    jobs = hydra_jobs(overrides, multirun)
    with _hydra():
        return [(shown, _compose("config", composed, True)) for shown, composed in jobs]


class JobAhead(Protocol):
    """Work for every valid job done while the pre-flight holds its config.

    ``prepare`` may run in a forked worker (`lcab.config.fork_map`): it must return what it
    made (picklable) rather than keep it; ``adopt`` then runs in the command's own process.
    """

    def prepare(self, cfg: DictConfig, cell: Cell) -> Any:
        """What the command will want for this job (errors it knows: return None)."""

    def adopt(self, value: Any) -> None:
        """Keep one job's ``prepare`` result in this process."""


def check_jobs(
    overrides: list[str],
    multirun: bool,
    extra: JobCheck | None = None,
    config_name: str = "config",
    ahead: JobAhead | None = None,
    workers: int = 1,
) -> list[str]:
    """Problems of every job (empty: all jobs compose, resolve and pass ``extra``).

    ``workers`` > 1 checks the jobs in that many processes (`lcab.config.fork_map`);
    ``ahead`` prepares each valid job there too.
    """
    try:
        jobs = hydra_jobs(overrides, multirun, config_name)
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        with _hydra():
            return [_explain(err, overrides, config_name)]

    def check(job_lists: tuple[list[str], list[str]]) -> tuple[list[str], Any]:
        job, composed = job_lists
        where = " ".join(job) or "(defaults)"
        try:
            cfg = _compose(config_name, composed, extra is not None)
            cell = resolve_cell(cfg)
            if extra is not None:
                problems = [f"{where}: {text}" for text in extra(cfg, cell)]
                if problems:
                    return problems, None
            return [], None if ahead is None else ahead.prepare(cfg, cell)
        except ConfigError as err:
            return [f"{where}: {err}"], None
        except (HydraException, OmegaConfBaseException, ValueError) as err:
            return [f"{where}: {_explain(err, job, config_name)}"], None

    with _hydra():
        outcomes = fork_map(check, jobs, workers)
    if ahead is not None:
        for _, value in outcomes:
            if value is not None:
                ahead.adopt(value)
    return [text for problems, _ in outcomes for text in problems]


def split_argv(argv: list[str]) -> tuple[list[str], bool]:
    """(overrides, multirun) of a command line."""
    multirun = "-m" in argv or "--multirun" in argv
    return [a for a in argv if a not in ("-m", "--multirun")], multirun


def preflight(
    argv: list[str],
    extra: JobCheck | None = None,
    config_name: str = "config",
    ahead: JobAhead | None = None,
    workers: int = 1,
) -> int:
    """0 if every job of ``argv`` is valid, else print the problems and return 2.

    ``ahead`` and ``workers``: as `check_jobs`.
    """
    if any(a.split("=", 1)[0] in _PASSTHROUGH for a in argv):
        return 0
    overrides, multirun = split_argv(argv)
    problems = check_jobs(overrides, multirun, extra, config_name, ahead, workers)
    if not problems:
        return 0
    unique = list(dict.fromkeys(problems))
    print(f"lcab: {len(unique)} invalid setting(s); nothing was run:", file=sys.stderr)
    for text in unique:
        print(f"  - {text}", file=sys.stderr)
    return 2


def output_problem(argv: list[str], config_name: str = "config") -> str | None:
    """Why the run's output folder cannot be written (read-only, no permission), else None.

    Hydra writes there before lcab runs and would fail with a traceback; asked first, it is one
    line. The nearest folder that exists is tried.
    """
    if any(a.split("=", 1)[0] in _PASSTHROUGH for a in argv):
        return None
    overrides, multirun = split_argv(argv)
    try:
        first = hydra_jobs(overrides, multirun, config_name)[0][1]
        with _hydra():
            cfg = _compose(config_name, first, True)
            folder = Path(str(OmegaConf.select(cfg, f"hydra.{'sweep' if multirun else 'run'}.dir")))
    except (HydraException, OmegaConfBaseException, ValueError, IndexError):
        return None  # the pre-flight has said what is wrong with the config
    folder = folder.absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"cannot write to {folder}: {existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        cause = "read-only file system" if read_only else "permission denied"
        return f"cannot write to {folder}: {existing} is not writable ({cause})"
    return None
