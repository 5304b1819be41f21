"""A module bound to a name now and imported on first use: torch for code that only sometimes runs.

The planner, the dry run and ``--help`` import every registry module but never make a tensor;
importing torch was 2-3 s of a 6-9 s planner command. A module written as::

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy_module("torch", globals())

type-checks against torch and imports it at the first attribute read, rebinding the global to
the real module. Module-level code must not read it (`tests/unit/test_light_imports.py`).
Not ``importlib.util.LazyLoader``: its lazy module in ``sys.modules`` makes a later
``import torch.distributed`` run torch's ``__init__`` inside it, registering pybind types twice.
"""

from __future__ import annotations

import importlib
from typing import Any


class _LazyModule:
    """Stands for ``module`` under ``bound_as`` in ``namespace`` until its first attribute read."""

    __slots__ = ("_bound_as", "_module", "_namespace")

    def __init__(self, module: str, namespace: dict[str, Any], bound_as: str) -> None:
        self._module = module
        self._namespace = namespace
        self._bound_as = bound_as

    def _resolve(self) -> Any:
        real = importlib.import_module(self._module)
        if self._namespace.get(self._bound_as) is self:
            self._namespace[self._bound_as] = real
        return real

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._resolve(), attribute)

    def __setattr__(self, attribute: str, value: Any) -> None:
        """Its own three fields, or the real module's (a test's monkeypatch lands there)."""
        if attribute in _LazyModule.__slots__:
            object.__setattr__(self, attribute, value)
        else:
            setattr(self._resolve(), attribute, value)

    def __delattr__(self, attribute: str) -> None:
        delattr(self._resolve(), attribute)

    def __repr__(self) -> str:
        return f"<{self._module}, imported on first use as {self._bound_as!r}>"


def lazy_module(module: str, namespace: dict[str, Any], bound_as: str | None = None) -> Any:
    """A stand-in for ``module``, the global ``bound_as`` (default: its top name) of ``namespace``.

    ``namespace`` is the calling module's ``globals()``; the first attribute read imports
    ``module`` and puts it there in place of the stand-in.
    """
    return _LazyModule(module, namespace, bound_as or module.split(".")[0])
