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


def function_signature(source: str, name: str) -> SourceSignature:
    """The signature of top-level function ``name`` in ``source`` (defaults as Python values).

    Raises:
        KeyError: no such top-level function.

    """
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
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
            return SourceSignature(
                tuple(a.arg for a in (*positional, *args.kwonlyargs)),
                defaults,
                tuple(a.arg for a in args.kwonlyargs),
            )
    raise KeyError(name)
