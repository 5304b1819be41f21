"""Compose each distinct Hydra job once per process.

One command composes each job up to three times (lcab's pre-flight, Hydra's sweeper check, its
launcher), at 0.1-0.5 s each. The result of `ConfigLoaderImpl.load_configuration` depends only
on its arguments, the config files (newest mtime and count: an edited file is composed afresh)
and the working directory, so `install` memoizes it by all of those and hands every caller its
own unpickled copy (callers mutate it). Failures are not memoized, and ``from_shell`` (wording
of errors only) is left out of the key. A 25-job planner sweep: 14.4 CPU-s with the memo, 32.0
without (``python -m lcab.perf startup``, shared 2-core host).

Private Hydra API on purpose: its public API offers no way to hand one composition to its
sweeper and launcher; the hydra-core<1.4 pin keeps `ConfigLoaderImpl` stable, and
tests/config/test_compose_cache.py compares the memo's answers to fresh compositions.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobRuntime
from omegaconf import DictConfig, OmegaConf, open_dict

_MEMO: dict[tuple[Any, ...], DictConfig] = {}
"""Pristine compositions by key; never handed out (copies are)."""

_PICKLED: dict[tuple[Any, ...], bytes] = {}
"""`_MEMO`'s compositions pickled, once each: every copy handed out is unpickled from these."""

_RUNTIME_NAMED: set[tuple[Any, ...]] = set()
"""Keys whose ``hydra.job.name`` came from Hydra's ``JobRuntime`` (not the config): a copy takes
the name current when it is handed out (the pre-flight's and the app's differ)."""

_COUNTS = {"composed": 0, "reused": 0}
"""How many calls composed and how many were answered from `_MEMO` (tests read it)."""


def counts() -> dict[str, int]:
    """Compositions made and reused by this process since `install` (a copy)."""
    return dict(_COUNTS)


def keys() -> set[tuple[Any, ...]]:
    """The keys composed so far (a worker's mark before its share, `lcab.config.fork_map`)."""
    return set(_MEMO)


def entries(exclude: set[tuple[Any, ...]] | None = None) -> dict[tuple[Any, ...], DictConfig]:
    """The compositions made so far, but those keyed in ``exclude`` (for another process)."""
    return {key: cfg for key, cfg in _MEMO.items() if key not in (exclude or set())}


def adopt(compositions: dict[tuple[Any, ...], DictConfig], runtime_named: set[Any]) -> None:
    """Take compositions another copy of this process made (same files, folder and configs)."""
    for key, cfg in compositions.items():
        _MEMO.setdefault(key, cfg)
    _RUNTIME_NAMED.update(runtime_named & set(compositions))


def runtime_named() -> set[tuple[Any, ...]]:
    """Keys whose job name is the process's (sent with `entries` to another process)."""
    return set(_RUNTIME_NAMED)


def _folder_state(folder: str) -> tuple[int, int]:
    """(newest modification time in ns, number of entries) of everything under ``folder``."""
    newest, entries = 0, 0
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            try:
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime_ns)
            except OSError:
                continue
            entries += 1
    return newest, entries


def _key(loader: ConfigLoaderImpl, *arguments: Any) -> tuple[Any, ...]:
    """Everything a composition with ``arguments`` depends on besides Hydra's and lcab's code."""
    paths = tuple((e.provider, e.path) for e in loader.get_search_path().get_path())
    folders = [
        str(path).removeprefix("file://")
        for _, path in paths
        if "://" not in str(path) or str(path).startswith("file://")
    ]
    files = tuple(_folder_state(folder) for folder in folders if Path(folder).is_dir())
    store = ConfigStore.instance().repo
    return (
        paths,
        files,
        (id(store), len(store)),
        os.getcwd(),
        *arguments,
    )


_FILES: dict[tuple[Any, ...], bytes] = {}
"""Config files as loaded (Hydra's ``ConfigResult``, pickled), by source, path and file state."""


def _memo_file_loads(source_type: Any, state: Callable[[Any, str], Any]) -> None:
    """Wrap ``source_type.load_config`` so that each config file is parsed once per process.

    Parsing was 37 % of composing a planner sweep. ``state`` gives what the content depends on
    (mtime and size), so an edited file is parsed again; each caller gets its own copy.
    """
    original = source_type.load_config
    if getattr(original, "_lcab_memo", False):
        return

    @functools.wraps(original)
    def load_config(self: Any, config_path: str) -> Any:
        key = (
            source_type.__name__,
            self.provider,
            self.path,
            config_path,
            state(self, config_path),
        )
        if key not in _FILES:
            result = original(self, config_path)
            try:
                _FILES[key] = pickle.dumps(result)
            except (pickle.PicklingError, TypeError, AttributeError):
                return result
            return pickle.loads(_FILES[key])
        return pickle.loads(_FILES[key])

    load_config._lcab_memo = True  # type: ignore[attr-defined]
    source_type.load_config = load_config


def _file_state(source: Any, config_path: str) -> tuple[int, int]:
    """(modification time in ns, size) of a file source's config file ((0, 0): none)."""
    name = source._normalize_file_name(config_path)
    try:
        stat = os.stat(os.path.join(source.path.removeprefix("file://"), name))
    except OSError:
        return 0, 0  # Hydra's own load raises ConfigLoadError, which is not memoized
    return stat.st_mtime_ns, stat.st_size


def _memo_sources(loader: ConfigLoaderImpl) -> None:
    """Memoize the file loads of ``loader``'s sources (classes as loaded now: Hydra reloads)."""
    for source in loader.repository.get_sources():
        scheme = type(source).scheme()
        if scheme == "file":
            _memo_file_loads(type(source), _file_state)
        elif scheme == "pkg":  # an installed package's files (Hydra's own): fixed
            _memo_file_loads(type(source), lambda source, path: None)
        elif scheme == "structured":
            _share_the_store(type(source))


def _share_the_store(source_type: Any) -> None:
    """Let a copy of a structured source share its ``ConfigStore`` (the process's singleton).

    Each composition deep-copies Hydra's config repository, store included (~10 ms); loads
    from the store are copies already (``ConfigStore.load``).
    """
    if getattr(source_type, "_lcab_shares_store", False):
        return
    source_type.__deepcopy__ = lambda self, memo: copy.copy(self)
    source_type._lcab_shares_store = True


def install() -> None:
    """Wrap `ConfigLoaderImpl.load_configuration` and the file loads with memos (idempotent)."""
    original = ConfigLoaderImpl.load_configuration
    if getattr(original, "_lcab_memo", False):
        return

    @functools.wraps(original)
    def load_configuration(
        self: ConfigLoaderImpl,
        config_name: str | None,
        overrides: list[str],
        run_mode: Any,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        key = _key(self, config_name, tuple(overrides), run_mode, validate_sweep_overrides)
        _memo_sources(self)
        if key in _MEMO:
            _COUNTS["reused"] += 1
        else:
            _MEMO[key] = original(
                self,
                config_name=config_name,
                overrides=overrides,
                run_mode=run_mode,
                from_shell=from_shell,
                validate_sweep_overrides=validate_sweep_overrides,
            )
            if OmegaConf.select(_MEMO[key], "hydra.job.name") == JobRuntime().get("name"):
                _RUNTIME_NAMED.add(key)
            _COUNTS["composed"] += 1
        cfg = _copy(key)
        if key in _RUNTIME_NAMED:
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.name = JobRuntime().get("name")
        return cfg

    load_configuration._lcab_memo = True  # type: ignore[attr-defined]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]


def _copy(key: tuple[Any, ...]) -> DictConfig:
    """A copy of ``key``'s composition to change: unpickled (3 ms), not deep-copied (22 ms)."""
    if key not in _PICKLED:
        try:
            _PICKLED[key] = pickle.dumps(_MEMO[key])
        except (pickle.PicklingError, TypeError, AttributeError):  # a node pickle cannot hold
            return copy.deepcopy(_MEMO[key])
    loaded: DictConfig = pickle.loads(_PICKLED[key])
    return loaded
