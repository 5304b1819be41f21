"""What an installed library callable is and which parameters it takes, whatever its kind.

``inspect.signature`` of a ``torch.library.custom_op`` or a ``torch.ops`` operator is
``(*args, **kwargs)``, so a check built on it cannot fail. Here each kind is read where its
parameters live — a custom op's wrapped function, an operator's schema — as
``inspect.Parameter``s, for the version probe and the backward's signature check alike.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def callable_kind(fn: Any) -> str:
    """What ``fn`` is, in the `UpstreamFunction.kind` vocabulary plus two refusals.

    ``custom_op`` (a ``torch.library.custom_op``), ``library_op`` (an operator under
    ``torch.ops``), ``function`` (any other callable), ``missing`` (None), ``not callable``.
    """
    if fn is None:
        return "missing"
    if isinstance(fn, _custom_op_type()):
        return "custom_op"
    if isinstance(fn, torch._ops.OpOverloadPacket | torch._ops.OpOverload):
        return "library_op"
    return "function" if callable(fn) else "not callable"


def _custom_op_type() -> type:
    """``torch._library.custom_ops.CustomOpDef`` (private: looked up, never assumed)."""
    from torch._library import custom_ops

    return getattr(custom_ops, "CustomOpDef", type(None))


def operator_schema(fn: Any) -> Any:
    """An operator's schema — a packet's ``default`` overload's — or None if it has none."""
    if isinstance(fn, torch._ops.OpOverload):
        return fn._schema
    return fn.default._schema if "default" in fn.overloads() else None


def missing_default_overload(fn: Any) -> str | None:
    """Why an operator packet cannot be read (None: it can, or it is no packet)."""
    if callable_kind(fn) != "library_op" or operator_schema(fn) is not None:
        return None
    return f"has no default overload (overloads: {', '.join(fn.overloads()) or 'none'})"


def parameters_of(fn: Any) -> list[inspect.Parameter] | None:
    """The named parameters of an installed callable, in order (None: unreadable)."""
    kind = callable_kind(fn)
    if kind == "library_op":
        schema = operator_schema(fn)
        if schema is None:
            return None
        return [
            inspect.Parameter(
                argument.name,
                inspect.Parameter.KEYWORD_ONLY
                if argument.kwarg_only
                else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=argument.default_value
                if argument.has_default_value()
                else inspect.Parameter.empty,
            )
            for argument in schema.arguments
        ]
    if kind == "custom_op":
        fn = fn._init_fn
    try:
        found = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in found if p.kind not in variadic]


def takes_any_keyword(fn: Any) -> bool:
    """Whether ``fn`` accepts keywords it does not name (a plain ``**kwargs``; never an op)."""
    if callable_kind(fn) != "function":
        return False
    try:
        found = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in found)
