"""One generic name → implementation registry for masks, kernels and CP strategies.

Names are permanent: they are CLI values, folder names and record fields. Tests parametrise over
`Registry.names()`, so registering something is all it takes to have it tested.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError, KeyError):
    """A name that is not registered; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Ordered mapping of canonical names (plus aliases) to implementations."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def add(self, name: str, item: T, aliases: tuple[str, ...] = ()) -> T:
        """Register ``item`` under ``name`` (and ``aliases``)."""
        for key in (name, *aliases):
            if key in self._items or key in self._aliases:
                raise ValueError(f"{self.kind} {key!r} is already registered")
        self._items[name] = item
        for alias in aliases:
            self._aliases[alias] = name
        return item

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator form of `add`."""

        def deco(item: T) -> T:
            return self.add(name, item, aliases)

        return deco

    def canonical(self, name: str) -> str:
        """The canonical name for ``name`` or one of its aliases."""
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        valid = ", ".join(self.names())
        alias_note = (
            f" (aliases: {', '.join(f'{a}={c}' for a, c in self._aliases.items())})"
            if self._aliases
            else ""
        )
        raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {valid}{alias_note}")

    def get(self, name: str) -> T:
        """The implementation registered as ``name``.

        Raises UnknownNameError: not registered (the message lists valid names).
        """
        return self._items[self.canonical(name)]

    def names(self) -> list[str]:
        """Canonical names in registration order."""
        return list(self._items)

    def aliases(self) -> dict[str, str]:
        """Alias → canonical name."""
        return dict(self._aliases)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
