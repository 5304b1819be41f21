"""The optional package a kernel calls: declared once, checked so a bad install is a reason.

An older or differently built package may import fine and then fail deep inside a timed call,
so every mismatch becomes a ``skipped`` reason: installed (found without importing a parent
package), its version (from metadata, no import), and — only where the cell would run, since
importing a CUDA extension without CUDA can fail or be slow — every function and keyword the
adapter passes (`lcab.kernels.callables`). `cuda_available` answers without loading torch.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from lcab.kernels.callables import missing_default_overload, parameters_of, takes_any_keyword
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


@dataclass(frozen=True)
class ApiNeed:
    """One function an adapter calls and the keyword arguments it passes to it."""

    function: str
    """Attribute of the module, dotted for a method (``DotProductAttention.forward``)."""
    params: tuple[str, ...]
    positional: int | None = None
    """Leading arguments passed by position; when set, a required parameter lcab passes neither
    way is a reason too. None: not checked."""


@dataclass(frozen=True)
class PackageProbe:
    """The optional package a kernel calls, and what its adapter needs of it."""

    module: str
    """What the adapter imports (e.g. ``flash_attn``, ``transformer_engine.pytorch``)."""
    distributions: tuple[str, ...]
    """Distribution names to read the version from, first found wins (e.g. ``flash-attn``)."""
    needs: tuple[ApiNeed, ...] = ()
    """Functions of ``module`` and the keywords the adapter passes."""
    min_version: str | None = None
    """Lowest release the adapter was written for (None: no minimum). Pre/post tags are ignored
    (3.0.0b1 meets 3.0) unless the minimum is itself a pre-release (4.0.0b5): then PEP 440."""
    requirement: str = ""
    """What lcab needs, in words, for the reasons (e.g. ">= 2.8")."""
    package: str = ""
    """The import package whose installation is checked and recorded (`lcab.bench.environment.
    kernel_provenance`), where it is not ``module`` itself (``transformer_engine``)."""
    install: str = ""
    """How to install it: a command, for the reasons and the kernels guide's install table."""
    note: str = ""
    """What installing it costs or needs, for the install table."""

    @property
    def name(self) -> str:
        """The installed import package: `package`, else `module`."""
        return self.package or self.module


@functools.cache
def no_nvidia_driver() -> bool:
    """Whether this machine certainly has no CUDA device: no NVIDIA driver library loads.

    NVML fails in 30 ms where loading torch to ask costs 2 s; False only says "ask torch".
    """
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return True
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return False


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, without loading torch on a machine with no NVIDIA driver."""
    return not no_nvidia_driver() and torch.cuda.is_available()


def cuda_present() -> bool:
    """Whether a CUDA device is visible (a seam for tests of the import-time checks)."""
    return cuda_available()


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "2.8.3.post2" → (2, 8, 3); unparsable: ()."""
    try:
        return Version(version).release
    except InvalidVersion:
        return ()


def older_than(version: str, minimum: str) -> bool:
    """Whether ``version`` is below ``minimum``; ``0.0.0`` (setuptools-scm's fallback) never is."""
    if release(version) == (0, 0, 0):
        return False
    if release(version) and Version(minimum).is_prerelease:
        return Version(version) < Version(minimum)
    return release(version) < release(minimum)


def distribution_version(names: tuple[str, ...]) -> str | None:
    """Version of the first installed distribution among ``names`` (None: none installed)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def importable(module: str) -> bool:
    """Whether ``module`` can be found, without letting a missing or broken parent raise."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a spec-less module
        return module in sys.modules
    except Exception:  # a parent's __init__ raising anything else (FA2's under flash_attn.cute)
        return False


def installed(probe: PackageProbe) -> bool:
    """Whether the package is installed: a distribution of it, or a findable module."""
    found = distribution_version(probe.distributions) is not None or importable(probe.name)
    return found or importable(probe.module)


def api_reasons(probe: PackageProbe, version: str | None) -> list[str]:
    """Import ``probe.module`` and check each needed function and keyword exists."""
    label = f"{probe.module} {version or '(version unknown)'}"
    needs = f" (lcab needs {probe.requirement})" if probe.requirement else ""
    try:
        module = importlib.import_module(probe.module)
    except Exception as err:  # an extension built for another torch raises all sorts
        return [f"{label} is installed but fails to import: {type(err).__name__}: {err}{needs}"]
    reasons = []
    for need in probe.needs:
        fn = _resolve(module, need.function)
        if not callable(fn):
            reasons.append(f"{label} has no {need.function}{needs}")
            continue
        unreadable = missing_default_overload(fn)
        if unreadable:
            reasons.append(f"{label}'s {need.function} {unreadable}{needs}")
            continue
        found = parameters_of(fn)  # a custom op's and an operator's too, not (*args, **kwargs)
        if found is None:  # a builtin without a signature: cannot check
            continue
        params = {p.name: p for p in found}
        missing = [p for p in need.params if p not in params and not takes_any_keyword(fn)]
        if missing:
            reasons.append(f"{label} has no {', '.join(missing)} in {need.function}{needs}")
        required = _required_unpassed(params, need)
        if required:
            reasons.append(
                f"{label}'s {need.function} requires {', '.join(required)}, which lcab's "
                f"adapter does not pass{needs}"
            )
    return reasons


def _resolve(module: object, path: str) -> object:
    """``module.a.b`` for ``path`` "a.b" (a method of a class, say); None if missing."""
    target: object = module
    for name in path.split("."):
        target = getattr(target, name, None)
        if target is None:
            return None
    return target


def _required_unpassed(params: Mapping[str, inspect.Parameter], need: ApiNeed) -> list[str]:
    """Parameters without a default that the adapter passes neither by position nor keyword."""
    if need.positional is None:
        return []
    named = list(params.values())
    return [
        p.name
        for index, p in enumerate(named)
        if p.default is p.empty
        and p.name not in need.params
        and not (index < need.positional and p.kind is not p.KEYWORD_ONLY)
    ]


def imported_or_none(name: str) -> Any:
    """``name`` imported, or None when it is missing or fails to import (a reason elsewhere)."""
    try:
        return importlib.import_module(name)
    except Exception:  # a CUDA extension built for another torch raises all sorts
        return None


def _module_version(module: str) -> str | None:
    """``module.__version__`` of an importable module (None: none, or it fails to import)."""
    version = getattr(imported_or_none(module), "__version__", None)
    return version if isinstance(version, str) else None


def probe_reasons(probe: PackageProbe, device: torch.device | str) -> list[str]:
    """Why the installed ``probe.module`` does not fit the adapter (empty: it fits or is absent).

    The API check runs only where the cell would really run; the version check everywhere.
    """
    version = distribution_version(probe.distributions)
    device_type = device if isinstance(device, str) else device.type
    if device_type == "cuda" and cuda_present() and installed(probe):
        mismatches = api_reasons(probe, version)
        if mismatches:  # the precise reason: what is missing, in which version
            return mismatches
        version = version or _module_version(probe.module)
    if version is not None and probe.min_version and older_than(version, probe.min_version):
        return [
            f"{probe.module} {version} is older than lcab's adapter supports "
            f"(lcab needs {probe.requirement or f'>= {probe.min_version}'})"
        ]
    return []
