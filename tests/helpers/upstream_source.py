"""A library's real source on a CPU machine: its PyPI sdist, read with ``ast`` (never imported).

Some GPU libraries cannot be imported without CUDA, but their Python wrappers — the functions
lcab calls — ship in the sdist. Holding `lcab.kernels.upstream` rows to those files checks the
table against the library itself rather than against another reading of it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("LCAB_UPSTREAM_CACHE", Path.home() / ".cache" / "lcab" / "upstream"))


def sdist_member(distribution: str, version: str, member: str) -> str | None:
    """The text of ``member`` (a path inside the sdist's top folder), or None if unavailable.

    Downloads ``distribution==version`` once with pip (no build, no dependencies) into
    `CACHE`. flash-attn's setup.py imports torch even to name its metadata, so pip runs it in
    this interpreter's environment (``--no-build-isolation``) with the CUDA build switched off.
    """
    folder = CACHE / f"{distribution}-{version}"
    found = sorted(folder.glob("*.tar.gz"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        env = os.environ | {"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE", "PIP_NO_INPUT": "1"}
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation"]
        cmd += ["--no-binary", ":all:", f"{distribution}=={version}", "-d", str(folder)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        found = sorted(folder.glob("*.tar.gz"))
        if done.returncode or not found:
            return None
    with tarfile.open(found[0]) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        handle = tar.extractfile(f"{top}/{member}")
        return None if handle is None else handle.read().decode()


@dataclass(frozen=True)
class SourceSignature:
    """A function's parameters as its source writes them."""

    params: tuple[str, ...]
    defaults: dict[str, Any]
    keyword_only: tuple[str, ...]


def definition(tree: ast.Module, name: str) -> tuple[ast.FunctionDef, bool]:
    """The ``def`` of ``name`` (``f``, ``Class.method``; a class: its ``__init__``), and
    whether ``self`` must be dropped (a class row lists what ``inspect.signature`` shows).

    Raises:
        KeyError: no such definition.

    """
    *owners, last = name.split(".")
    body: list[ast.stmt] = tree.body
    try:
        for owner in owners:
            body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == owner).body
        node = next(n for n in body if getattr(n, "name", None) == last)
    except StopIteration:
        raise KeyError(name) from None
    if isinstance(node, ast.ClassDef):
        init = next(n for n in node.body if getattr(n, "name", None) == "__init__")
        assert isinstance(init, ast.FunctionDef)
        return init, True
    assert isinstance(node, ast.FunctionDef)
    return node, False


def signature_of(node: ast.FunctionDef, drop_self: bool = False) -> SourceSignature:
    """The parameters of a ``def`` as written (defaults as Python values)."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = {
        a.arg: ast.literal_eval(d)
        for a, d in zip(
            positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
        )
    }
    defaults |= {
        a.arg: ast.literal_eval(d)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
        if d is not None
    }
    names = [a.arg for a in (*positional, *args.kwonlyargs)]
    return SourceSignature(
        tuple(names[1:] if drop_self else names),
        defaults,
        tuple(a.arg for a in args.kwonlyargs),
    )


def function_signature(source: str, name: str) -> SourceSignature:
    """The signature of ``name`` (a function, ``Class.method`` or a class) in ``source``.

    Raises:
        KeyError: no such definition.

    """
    return signature_of(*definition(ast.parse(source), name))


@dataclass(frozen=True)
class SourceKind:
    """What a ``def``'s decorators make of it: a plain function or a torch custom op."""

    kind: str
    op: str = ""
    mutates: tuple[str, ...] = ()


def kind_of(node: ast.FunctionDef) -> SourceKind:
    """``custom_op`` when a decorator is a call of something named ``*custom_op*`` (upstream
    spells it ``torch.library.custom_op`` or a wrapper of it, ``_torch_custom_op_wrapper``)
    with the op's name first and ``mutates_args=`` a literal; ``function`` otherwise."""
    for decorator in node.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        func = decorator.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if "custom_op" not in called or not decorator.args:
            continue
        keywords = {k.arg: ast.literal_eval(k.value) for k in decorator.keywords if k.arg}
        mutates = keywords.get("mutates_args", ())
        return SourceKind("custom_op", ast.literal_eval(decorator.args[0]), tuple(mutates))
    return SourceKind("function")


def function_kind(source: str, name: str) -> SourceKind:
    """`kind_of` the ``def`` of ``name`` in ``source``.

    Raises:
        KeyError: no such definition.

    """
    return kind_of(definition(ast.parse(source), name)[0])
