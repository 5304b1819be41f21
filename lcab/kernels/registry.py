"""The kernel registry: name → Kernel class (tests and the support matrix iterate over it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lcab.kernels.base import Kernel
from lcab.registry import Registry

KERNELS: Registry[type[Kernel]] = Registry("kernel")


def register_kernel(cls: type[Kernel]) -> type[Kernel]:
    """Class decorator: register ``cls`` under ``cls.name``."""
    KERNELS.add(cls.name, cls)
    return cls


def get_kernel(name: str, **options: Any) -> Kernel:
    """An instance of kernel ``name`` (options are the kernel's config fields).

    Raises:
        UnknownNameError: a ValueError listing the registered kernels.

    """
    return KERNELS.get(name)(**options)


def list_kernels() -> list[str]:
    """Registered kernel names, in registration order."""
    return KERNELS.names()


KernelFactory = Callable[..., Kernel]
