"""A built GPU library's real interface, recorded once where it can be imported and read back
in every CI run: the schemas of its operators and the signatures of the Python calls lcab makes.

A library's compiled extension registers ``torch.ops.<namespace>.*`` (FA3's ``flash_attn_3``
from ``flash_api_stable.cpp``), and its Python defines ``torch.library.custom_op``s on top
(``flash_attn_3::_flash_attn_backward``). Reading them takes the built wheel and torch's CUDA
libraries, not a GPU: ``launchers/kernel_build.sh`` builds the wheel, and

    TOOLCHAIN/bin/python -m tests.helpers.real_schemas record NAME SITE BUILD_JSON OUT_JSON

run in its toolchain venv (torch 2.11.0+cu130) with the wheel unpacked in ``SITE`` writes the
record (``tests/unit/data/real_schemas/NAME.json``): every operator of the namespace with its
schema string and the dispatch keys that have a kernel, every recorded Python callable with its
kind (``function``, ``custom_op``, ``library_op``), parameters, defaults and — for an operator —
its schema and the arguments it mutates, and the build's provenance (commit, submodules, flags,
toolchain) from ``build.json``. The stand-ins and lcab's rows are then held to this file
(``tests/unit/test_real_schemas.py``), never to lcab's own reading.

Standard library and torch only: it runs in the toolchain venv, which has no lcab requirements.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "real_schemas"


@dataclass(frozen=True)
class LibrarySpec:
    """What to read of one built library: its op namespace and the callables lcab uses."""

    namespace: str
    imports: tuple[str, ...]
    """Modules imported first (they register the operators)."""
    callables: tuple[str, ...]
    """``module:attribute`` of each Python callable to record (dotted: an attribute's)."""


SPECS = {
    "fa3": LibrarySpec(
        namespace="flash_attn_3",
        imports=("flash_attn_3._C", "flash_attn_interface"),
        callables=(
            "flash_attn_interface:flash_attn_func",
            "flash_attn_interface:flash_attn_varlen_func",
            "flash_attn_interface:_flash_attn_forward",
            "flash_attn_interface:_flash_attn_backward",
        ),
    ),
    "flashmask": LibrarySpec(
        namespace="flashmask",
        imports=("flashmask._C", "interface_torch"),
        callables=(
            "interface_torch:flashmask_attention",
            "interface_torch:flashmask_cuda.fwd",
            "interface_torch:flashmask_cuda.bwd",
        ),
    ),
    "ffa": LibrarySpec(  # MagiAttention: Python custom ops over its pybind extension
        namespace="flex_flash_attn",
        imports=("magi_attention", "magi_attention.functional.flex_flash_attn"),
        callables=(
            "magi_attention.functional:flex_flash_attn_func",
            "magi_attention.functional.flex_flash_attn:_flex_flash_attn_backward",
        ),
    ),
    "fa2": LibrarySpec(  # flash-attn 2.8.3.post2: Python custom ops over its pybind extension
        namespace="flash_attn",
        imports=("flash_attn_2_cuda", "flash_attn.flash_attn_interface"),
        callables=(
            "flash_attn:flash_attn_func",
            "flash_attn:flash_attn_varlen_func",
            "flash_attn.flash_attn_interface:_flash_attn_backward",
            "flash_attn.flash_attn_interface:_flash_attn_varlen_backward",
        ),
    ),
    "bsa": LibrarySpec(  # Block-Sparse-Attention: Python custom ops over a pybind extension
        namespace="flash_attn",  # its custom ops: flash_attn::_block_sparse_attn_forward, ...
        imports=("block_sparse_attn",),
        callables=("block_sparse_attn:block_sparse_attn_func",),
    ),
}

PROVENANCE = ("wheel", "wheel_sha256", "source", "commit", "submodules", "flags", "toolchain")
"""What the record keeps of the build's ``build.json``."""
_MUTATED = re.compile(r"Tensor\([a-z0-9_]+!\)\?? (\w+)")


def mutated_arguments(schema: str) -> tuple[str, ...]:
    """The arguments a schema marks as written (``Tensor(a!) name``), in order."""
    arguments = schema[schema.index("(") + 1 : schema.rindex(") ->")]
    return tuple(_MUTATED.findall(arguments))


def _jsonable(value: Any) -> Any:
    """A default as JSON keeps it (tuples become lists; the reader turns them back)."""
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return {"repr": repr(value)}


def _operator_entry(op: Any) -> dict[str, Any]:
    import torch

    name = op.name() if hasattr(op, "name") else str(op)
    keys = [k for k in ("CPU", "CUDA", "Meta") if torch._C._dispatch_has_kernel_for_dispatch_key(
        name, k)]  # fmt: skip
    schema = str(op._schema)
    return {"schema": schema, "kernels": keys, "mutates": list(mutated_arguments(schema))}


def describe(fn: Any) -> dict[str, Any]:
    """Kind, parameters, defaults (and an operator's schema) of one installed callable."""
    import torch
    from torch._library import custom_ops

    entry: dict[str, Any] = {}
    if isinstance(fn, custom_ops.CustomOpDef):
        entry["kind"] = "custom_op"
        entry |= _operator_entry(getattr(torch.ops, fn._namespace).__getattr__(fn._name).default)
        entry["op"] = f"{fn._namespace}::{fn._name}"
        fn = fn._init_fn
    elif isinstance(fn, torch._ops.OpOverloadPacket | torch._ops.OpOverload):
        entry["kind"] = "library_op"
        overload = fn.default if isinstance(fn, torch._ops.OpOverloadPacket) else fn
        entry |= _operator_entry(overload)
        entry["op"] = overload._schema.name
        arguments = overload._schema.arguments
        entry["params"] = [a.name for a in arguments]
        entry["keyword_only"] = [a.name for a in arguments if a.kwarg_only]
        entry["defaults"] = {
            a.name: _jsonable(a.default_value) for a in arguments if a.has_default_value()
        }
        return entry
    else:
        entry["kind"] = "function"
    parameters = inspect.signature(fn).parameters.values()
    entry["params"] = [
        p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    entry["keyword_only"] = [p.name for p in parameters if p.kind == p.KEYWORD_ONLY]
    entry["defaults"] = {
        p.name: _jsonable(p.default) for p in parameters if p.default is not p.empty
    }
    return entry


def record(name: str, site: Path, build_json: Path) -> dict[str, Any]:
    """The record of library ``name`` imported from ``site`` (see the module doc)."""
    import torch

    sys.path.insert(0, str(site))
    build = json.loads(build_json.read_text())
    return {
        "kernel": name,
        "provenance": {key: build[key] for key in PROVENANCE}
        | {"read_with_torch": torch.__version__},
        **interface(name),
    }


def interface(name: str) -> dict[str, Any]:
    """The ``operators`` and ``callables`` of library ``name``, importable now (what a record
    holds besides its provenance; ``launchers/wheel_check.py`` compares a new build's with it)."""
    import torch

    spec = SPECS[name]
    for module in spec.imports:
        importlib.import_module(module)
    prefix = f"{spec.namespace}::"
    operators = {}
    for qualname in sorted(torch._C._dispatch_get_all_op_names()):
        if qualname.startswith(prefix):
            op_name, _, overload = qualname[len(prefix) :].partition(".")
            packet = getattr(getattr(torch.ops, spec.namespace), op_name)
            operators[qualname] = _operator_entry(getattr(packet, overload or "default"))
    callables = {}
    for target in spec.callables:
        module, attribute = target.split(":")
        found: Any = importlib.import_module(module)
        for part in attribute.split("."):  # flashmask_cuda.bwd: an op of a module attribute
            found = getattr(found, part)
        callables[target] = describe(found)
    return {"operators": operators, "callables": callables}


def load(name: str) -> dict[str, Any]:
    """The committed record of ``name`` (``tests/unit/data/real_schemas/NAME.json``)."""
    return json.loads((DATA / f"{name}.json").read_text())


def default_of(value: Any) -> Any:
    """A recorded default as Python has it (lists were tuples; ``repr`` entries stay text)."""
    if isinstance(value, list):
        return tuple(default_of(v) for v in value)
    return value


def recorded_row(name: str, target: str) -> Any:
    """The record's callable ``module:attribute`` as an `UpstreamFunction` row — the shape the
    stand-ins are built from (`tests.helpers.standin_rows.from_row`) — whose every fact comes
    from the file, none from lcab's own table."""
    from lcab.kernels.upstream.facts import UpstreamFunction

    record_ = load(name)
    entry = record_["callables"][target]
    module, attribute = target.split(":")
    return UpstreamFunction(
        module=module,
        name=attribute,
        params=tuple(entry["params"]),
        defaults={key: default_of(value) for key, value in entry["defaults"].items()},
        keyword_only=tuple(entry["keyword_only"]),
        kind=entry["kind"],
        op=entry.get("op", ""),
        mutates=tuple(entry.get("mutates", ())),
        source=f"tests/unit/data/real_schemas/{name}.json (built "
        f"{record_['provenance']['source']}@{record_['provenance']['commit'][:8]})",
    )


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[0] != "record" or argv[1] not in SPECS:
        print(
            f"usage: python -m tests.helpers.real_schemas record {{{','.join(SPECS)}}} "
            "SITE BUILD_JSON OUT_JSON",
            file=sys.stderr,
        )
        return 2
    facts = record(argv[1], Path(argv[2]), Path(argv[3]))
    out = Path(argv[4])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(facts, indent=1, sort_keys=False) + "\n")
    print(f"real_schemas: {len(facts['operators'])} operators, {len(facts['callables'])} "
          f"callables of {argv[1]} -> {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
