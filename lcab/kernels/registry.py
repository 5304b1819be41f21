"""The kernel registry: name → Kernel class (tests, tables and lists iterate over it)."""

from __future__ import annotations

import re
from typing import Any

from lcab.kernels.base import Kernel
from lcab.registry import Registry

KERNELS: Registry[type[Kernel]] = Registry("kernel")


def register_kernel(cls: type[Kernel]) -> type[Kernel]:
    """Class decorator: register ``cls`` under ``cls.name`` (its colour unique ``#rrggbb``)."""
    colour = getattr(cls, "colour", None)
    taken = {KERNELS.get(n).colour: n for n in KERNELS.names()}
    if not isinstance(colour, str) or not re.fullmatch(r"#[0-9a-f]{6}", colour):
        raise ValueError(f"kernel {cls.name!r}: colour={colour!r}, need '#rrggbb' (lower case)")
    if colour in taken:
        raise ValueError(f"kernel {cls.name!r}: colour {colour} is kernel {taken[colour]!r}'s")
    KERNELS.add(cls.name, cls)
    return cls


def get_kernel(name: str, **options: Any) -> Kernel:
    """An instance of kernel ``name`` (options are the kernel's config fields)."""
    return KERNELS.get(name)(**options)


def list_kernels() -> list[str]:
    """Registered kernel names, in registration order."""
    return KERNELS.names()


def gpu_compared() -> list[str]:
    """The kernels of lcab's GPU comparisons (`Kernel.gpu_compared`): torch's own first."""
    names = [n for n in KERNELS.names() if KERNELS.get(n).gpu_compared]
    return sorted(names, key=lambda n: KERNELS.get(n).caps.requires is not None)
