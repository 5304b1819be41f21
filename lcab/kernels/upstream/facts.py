"""The row types of the upstream tables: a library function and its LSE, as its source says.

Parameter names are every parameter of the upstream function in order, with its defaults, so a
stand-in built from a row accepts exactly the calls the real function accepts.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

LseLayout = Literal["bhs", "ht", "th", "bhs1"]
"""(B, H, S); (H, total_q); (total_q, H); (B, H, S, 1)."""

CallableKind = Literal["function", "custom_op", "library_op"]
"""Plain Python; wrapped by ``torch.library.custom_op``; or an operator its C++ extension
defines with ``TORCH_LIBRARY`` (reached only under ``torch.ops``)."""

REQUIRED: Any = inspect.Parameter.empty
"""Marks a parameter without a default in `UpstreamFunction.defaults` (the default)."""


@dataclass(frozen=True)
class LseFact:
    """How a function's log-sum-exp comes back (or goes in, for a backward)."""

    layout: LseLayout
    base: Literal["e", "2"] = "e"
    """Natural log, or log2 (FlashInfer)."""
    dtype: str = "float32"
    empty_rows: str = "undocumented"
    """Value on rows that attend no key, as the source writes it (``+inf``, ``-inf``, ...)."""
    differentiable: bool = False
    """Whether a gradient given to the LSE reaches the inputs. False for fused kernels whose
    backward ignores ``dlse`` although autograd sees an LSE that requires grad."""
    varlen_layout: LseLayout | None = None
    """Layout of the varlen variant's LSE, when the library has one and it differs."""


@dataclass(frozen=True)
class UpstreamFunction:
    """One library function, as its source defines it."""

    module: str
    """Import path (``flash_attn.flash_attn_interface``)."""
    name: str
    """Attribute of the module (dotted for a method)."""
    params: tuple[str, ...]
    """Every parameter, in order (``*args``/``**kwargs`` excluded)."""
    source: str
    """Where this row was read: ``owner/repo@version-or-commit:path[:lines]``."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Defaults of the parameters that have one (the others are required)."""
    keyword_only: tuple[str, ...] = ()
    """Parameters after a bare ``*``."""
    returns: tuple[str, ...] = ()
    """What it returns, in order (its arity); empty: returns None or fills outputs in place."""
    lse: LseFact | None = None
    alignment: str = ""
    """Causal / window diagonal alignment (``bottom-right``, ``top-left``, ``n/a``)."""
    notes: str = ""
    kind: CallableKind = "function"
    """What kind of object the module attribute is (read from the source's decorator)."""
    op: str = ""
    """An op's ``namespace::name`` (empty for a plain function)."""
    mutates: tuple[str, ...] = ()
    """An op's mutated arguments (``mutates_args``; ``Tensor(a!)`` in a schema)."""

    def __post_init__(self) -> None:
        unknown = (set(self.defaults) | set(self.keyword_only) | set(self.mutates)) - set(
            self.params
        )
        if unknown:
            raise ValueError(f"{self.qualname}: {sorted(unknown)} are not among its params")
        if (self.kind != "function") != bool(self.op):
            raise ValueError(f"{self.qualname}: an op has an op name, a function none")

    @property
    def qualname(self) -> str:
        """``module.name``."""
        return f"{self.module}.{self.name}"

    def signature(self) -> inspect.Signature:
        """The function's signature, built from this row (what a stand-in exposes)."""
        kinds = inspect.Parameter
        parameters: list[inspect.Parameter] = []
        for name in self.params:
            kind = kinds.KEYWORD_ONLY if name in self.keyword_only else kinds.POSITIONAL_OR_KEYWORD
            parameters.append(kinds(name, kind, default=self.defaults.get(name, REQUIRED)))
        return inspect.Signature(parameters)

    def bind(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Arguments of a call as the real function would receive them (TypeError if it would)."""
        bound = self.signature().bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


def upstream_function(
    module: str, name: str, signature: str, source: str, **facts: Any
) -> UpstreamFunction:
    """A row whose parameters are written as the source writes them, so they read as its ``def``.

    ``signature`` is a parameter list, ``"q, k, v, causal=False, *, scale=None"``: names in
    order, literal defaults (`ast.literal_eval`), a bare ``*`` before keyword-only ones.
    """
    tree = ast.parse(f"def f({signature}): pass").body[0]
    assert isinstance(tree, ast.FunctionDef)
    args = tree.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    keyword_only = tuple(a.arg for a in args.kwonlyargs)
    defaults = dict(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    defaults |= {
        a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    }
    return UpstreamFunction(
        module,
        name,
        (*positional, *keyword_only),
        source,
        defaults={key: ast.literal_eval(node) for key, node in defaults.items()},
        keyword_only=keyword_only,
        **facts,
    )
