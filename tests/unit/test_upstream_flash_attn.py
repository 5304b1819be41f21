"""The FA2 table (`lcab.kernels.upstream.flash_attn`) held to flash-attn's own source.

flash-attn's compiled extension needs CUDA, but its sdist on PyPI carries
``flash_attn_interface.py``, the file the wheel installs: every FA2 row's parameters, their
order, defaults and keyword-only marks must be the ones that file defines, and its kind (plain
function or ``torch.library.custom_op``, with the op's name and mutated arguments) the one its
decorators give — read twice: from the file's AST, and from the objects the file defines when
it is imported unchanged over the emulated extension (`tests.helpers.emulated_flash_attn`). A
row that says what the library does not fails here; a CI run (``CI`` set) without the sdist
fails rather than skips. FA3 (hopper build) and FFA (MagiAttention) are not on PyPI: their rows
are read from the commits they cite, and the stand-ins in ``tests/helpers`` reproduce them.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from lcab.kernels import flash_backward
from lcab.kernels.upstream import flash_attn as table
from lcab.kernels.upstream.facts import UpstreamFunction
from tests.helpers import emulated_flash_attn
from tests.helpers.upstream_source import function_kind, function_signature, sdist_member

VERSION = "2.8.3.post2"


@pytest.fixture(scope="module")
def interface_source() -> str:
    text = sdist_member("flash-attn", VERSION, "flash_attn/flash_attn_interface.py")
    if text is None:
        if os.environ.get("CI"):
            pytest.fail("CI could not download the flash-attn sdist from PyPI")
        pytest.skip("flash-attn sdist not downloadable here (no PyPI)")
    return text


@pytest.mark.parametrize("row", table.FA2_ROWS, ids=lambda r: r.name)
def test_fa2_row_matches_the_sdist_source(row: UpstreamFunction, interface_source: str) -> None:
    real = function_signature(interface_source, row.name)
    assert row.params == real.params
    assert dict(row.defaults) == real.defaults
    assert row.keyword_only == real.keyword_only


def test_source_check_catches_a_wrong_row(interface_source: str) -> None:
    """The comparison can fail: FA3's backward row is not FA2's function."""
    real = function_signature(interface_source, "_flash_attn_backward")
    assert table.FA3_BACKWARD.params != real.params


def test_fa2_public_calls_pad_head_dim_and_the_private_backward_does_not(
    interface_source: str,
) -> None:
    """The fact the adapter's backward relies on (it pads to a multiple of 8 itself)."""
    public_forward = interface_source[interface_source.index("class FlashAttnFunc") :]
    assert "head_size_og % 8 != 0" in public_forward.split("def flash_attn_qkvpacked_func")[0]
    private = interface_source[
        interface_source.index("def _flash_attn_backward(") : interface_source.index(
            "def _flash_attn_backward_fake("
        )
    ]
    assert "pad" not in private


@pytest.mark.parametrize("row", table.FA2_ROWS, ids=lambda r: r.name)
def test_fa2_row_kind_matches_the_sdist_decorators(
    row: UpstreamFunction, interface_source: str
) -> None:
    real = function_kind(interface_source, row.name)
    assert (row.kind, row.op, row.mutates) == (real.kind, real.op, real.mutates)


def disagreements(row: UpstreamFunction, obj: Any) -> list[str]:
    """How the object the library's Python defines differs from the row (empty: not at all)."""
    found = []
    kind = flash_backward.callable_kind(obj)
    if kind != row.kind:
        found.append(f"kind {kind}, the row says {row.kind}")
    if flash_backward.parameters(obj) != row.params:
        found.append(f"parameters {flash_backward.parameters(obj)}, the row says {row.params}")
    if kind == "custom_op":
        schema = obj._opoverload._schema
        writes = tuple(a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write)
        if (schema.name, writes) != (row.op, row.mutates):
            found.append(f"op {schema.name} mutating {writes}, the row says {row.op} {row.mutates}")
    return found


@pytest.fixture(scope="module")
def real_objects() -> Iterator[dict[str, Any]]:
    """Each FA2 row's object, from the sdist's files imported over the emulated extension."""
    with emulated_flash_attn.loaded():
        yield {
            row.qualname: getattr(importlib.import_module(row.module), row.name)
            for row in table.FA2_ROWS
        }


@pytest.mark.parametrize("row", table.FA2_ROWS, ids=lambda r: r.name)
def test_fa2_row_is_the_object_the_library_defines(
    row: UpstreamFunction, real_objects: dict[str, Any]
) -> None:
    assert disagreements(row, real_objects[row.qualname]) == []


def test_the_object_check_catches_a_wrong_kind(real_objects: dict[str, Any]) -> None:
    """The backward recorded as a plain function (what the table once implied) is caught."""
    row = table.FA2_BACKWARD
    as_function = dataclasses.replace(row, kind="function", op="", mutates=())
    found = disagreements(as_function, real_objects[row.qualname])
    assert found[0] == "kind custom_op, the row says function"
    renamed = dataclasses.replace(row, op="flash_attn::_flash_attn_bwd")
    assert disagreements(renamed, real_objects[row.qualname])
