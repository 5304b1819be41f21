"""Version probes for optional kernel packages: a mismatched install becomes a reason, not a crash.

An adapter is written against one documented API (function names, keyword arguments, return
layout). An older or differently built package may import fine and then fail deep inside a timed
call, or — worse — silently return a different LSE layout. A `PackageProbe` states what the
adapter relies on; `probe_reasons` turns every mismatch into a human-readable reason that the
runner records as ``skipped``:

1. the installed distribution's version, read with `importlib.metadata` (the package is *not*
   imported, so this is cheap and safe anywhere), against a minimum;
2. only when the cell would really run (the package is importable and CUDA is present): import
   the module and check that every function and keyword the adapter passes exists — read for a
   plain function, a custom op and an operator's schema alike (`lcab.kernels.callables`; an
   op's ``inspect.signature`` is ``(*args, **kwargs)``, which accepted any keyword). Importing
   a CUDA extension on a machine without CUDA can itself fail or be slow, which is why this
   step waits for CUDA.

Missing packages and missing CUDA are reported by `Kernel.environment_reasons`; a probe adds
nothing in those cases.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from lcab.kernels.base import cuda_available
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
    """How many leading arguments the adapter passes by position; when set, a parameter
    without a default that is neither among them nor in ``params`` is a reason too (an API
    generation that needs an argument lcab does not pass). None: not checked."""


@dataclass(frozen=True)
class PackageProbe:
    """What an adapter needs from one optional package."""

    module: str
    """Import name (e.g. ``flash_attn``)."""
    distributions: tuple[str, ...]
    """Distribution names to read the version from, first found wins (e.g. ``flash-attn``)."""
    needs: tuple[ApiNeed, ...]
    """Functions of ``module`` and the keywords the adapter passes."""
    min_version: str | None = None
    """Lowest release the adapter was written for (None: no minimum)."""
    requirement: str = ""
    """What lcab needs, in words, for the reasons (e.g. ">= 2.8")."""


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "2.8.3.post2" → (2, 8, 3); "3.0.0b1" → (3, 0, 0).

    Pre/post/local tags are ignored on purpose: the adapters depend on API generations, which
    the release numbers mark. Parsed by ``packaging`` (PEP 440); a version it cannot parse has
    no known release, ``()``, which compares below every real one.
    """
    try:
        return Version(version).release
    except InvalidVersion:
        return ()


def distribution_version(names: tuple[str, ...]) -> str | None:
    """Version of the first installed distribution among ``names`` (None: none installed)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cuda_present() -> bool:
    """Whether a CUDA device is visible (a seam for tests of the import-time checks)."""
    return cuda_available()


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a spec-less module
        return module in sys.modules


def api_reasons(probe: PackageProbe, version: str | None) -> list[str]:
    """Import ``probe.module`` and check each needed function and keyword exists.

    Only called when the cell would run (see the module docstring).
    """
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


def probe_reasons(probe: PackageProbe, device: torch.device | str) -> list[str]:
    """Why the installed ``probe.module`` does not fit the adapter (empty: it fits or is absent).

    The API check runs only when ``device`` is CUDA, CUDA is present and the module is
    importable — i.e. when the cell would otherwise really run — and its reasons come first
    (they say what is missing); the version check needs no import and runs everywhere.
    """
    version = distribution_version(probe.distributions)
    device_type = device if isinstance(device, str) else device.type
    would_run = device_type == "cuda" and cuda_present() and _importable(probe.module)
    if would_run:
        mismatches = api_reasons(probe, version)
        if mismatches:  # the precise reason: what is missing, in which version
            return mismatches
    too_old = (
        version is not None
        and probe.min_version is not None
        and release(version) < release(probe.min_version)
    )
    if too_old:
        return [
            f"{probe.module} {version} is older than lcab's adapter supports "
            f"(lcab needs {probe.requirement or f'>= {probe.min_version}'})"
        ]
    return []
