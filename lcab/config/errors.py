"""`ConfigError`: a bad config value, named by key, value and what is valid.

Its own module so that the command line can catch it without importing what resolution needs
(torch and the kernel, mask and strategy registries).
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A bad config value: ``key``, ``value`` and what is valid."""

    def __init__(self, key: str, value: Any, valid: str) -> None:
        self.key, self.value, self.valid = key, value, valid
        super().__init__(f"{key}={value!r} is invalid: {valid}")
