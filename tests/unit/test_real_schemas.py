"""lcab's FA3 rows and stand-in held to the real build's recorded interface, in every CI run.

``tests/unit/data/real_schemas/fa3.json`` was read from FA3 as ``launchers/kernel_build.sh``
builds it — its extension loaded (torch 2.11.0+cu130 on a CPU) and its own
``flash_attn_interface`` imported — by ``bash launchers/kernel_build.sh schemas fa3``. Every FA3
row lcab calls through must say what that file says (parameters, defaults, kind of object, op
name, mutated arguments), the file must be of the build the recipe pins, and the FA3 stand-in is
built from the file (`tests.helpers.standin_flash_attn`), so neither side can be lcab's reading
checked against itself. ``tests/unit/test_real_wheels.py`` re-reads the live build when it is
cached here.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from lcab.kernels import flash_backward
from lcab.kernels.upstream import flash_attn as table
from lcab.kernels.upstream.facts import UpstreamFunction
from tests.helpers import real_schemas, standin_flash_attn

ROOT = Path(__file__).resolve().parents[2]
ROWS = {
    "flash_attn_interface:flash_attn_func": table.FA3_FUNC,
    "flash_attn_interface:flash_attn_varlen_func": table.FA3_VARLEN_FUNC,
    "flash_attn_interface:_flash_attn_backward": table.FA3_BACKWARD,
}
FIELDS = ("module", "name", "params", "keyword_only", "kind", "op", "mutates")


def differences(row: UpstreamFunction, recorded: UpstreamFunction) -> list[str]:
    """Where a row of lcab's table says other than the record (empty: nowhere)."""
    found = [
        f"{field}: {getattr(row, field)!r} vs recorded {getattr(recorded, field)!r}"
        for field in FIELDS
        if getattr(row, field) != getattr(recorded, field)
    ]
    if dict(row.defaults) != dict(recorded.defaults):
        found.append(f"defaults: {dict(row.defaults)} vs recorded {dict(recorded.defaults)}")
    return found


@pytest.mark.parametrize("target", sorted(ROWS))
def test_lcabs_fa3_rows_are_the_built_library(target: str) -> None:
    assert differences(ROWS[target], real_schemas.recorded_row("fa3", target)) == []


def test_the_comparison_catches_a_row_that_differs() -> None:
    """The 2025-08 generation's backward is not the built one; a changed default is caught."""
    recorded = real_schemas.recorded_row("fa3", "flash_attn_interface:_flash_attn_backward")
    assert differences(table.FA3_BACKWARD_AUG_2025, recorded)
    changed = dataclasses.replace(
        table.FA3_BACKWARD, defaults={**table.FA3_BACKWARD.defaults, "sm_margin": 1}
    )
    assert any(line.startswith("defaults") for line in differences(changed, recorded))


def recipe(name: str) -> tuple[str, dict[str, str], list[str]]:
    """(commit, submodules, flags) of a recipe, as ``kernel_build.sh list`` prints them."""
    listing = subprocess.run(
        ["bash", str(ROOT / "launchers" / "kernel_build.sh"), "list"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.splitlines()  # fmt: skip
    head = next(i for i, line in enumerate(listing) if line.startswith(f"{name}: "))
    source, *submodules = listing[head].split(" -> ")[0].split()[1:]
    flags = listing[head + 1].removeprefix("  flags: ").split()
    return source.split("@")[1], dict(s.split("=", 1) for s in submodules), flags


def test_the_record_is_of_the_build_the_recipe_pins() -> None:
    """A recipe changed without re-recording (``kernel_build.sh schemas fa3``) fails here."""
    provenance = real_schemas.load("fa3")["provenance"]
    commit, submodules, flags = recipe("fa3")
    assert provenance["commit"] == commit
    assert provenance["submodules"] == submodules
    assert provenance["flags"] == flags
    assert provenance["toolchain"]["torch"] == "2.11.0+cu130"  # the GPU image's torch
    assert provenance["toolchain"]["arch"] == "sm_90a"


def test_the_compiled_ops_run_on_cuda_only() -> None:
    """Why a CPU run needs the emulation registered (`tests.helpers.real_wheels.load_fa3`)."""
    operators = real_schemas.load("fa3")["operators"]
    assert operators["flash_attn_3::fwd"]["kernels"] == ["CUDA"]
    assert operators["flash_attn_3::bwd"]["kernels"] == ["CUDA"]
    assert operators["flash_attn_3::bwd"]["mutates"] == ["dq", "dk", "dv"]


def test_the_standin_is_built_from_the_record() -> None:
    recorded = real_schemas.load("fa3")["operators"]["flash_attn_3::_flash_attn_backward"]
    op = standin_flash_attn.fa3_flash_attn_backward
    assert str(op._opoverload._schema) == recorded["schema"]
    assert flash_backward.callable_kind(op) == "custom_op"
    assert flash_backward.fa3_generation(op) is table.FA3_BACKWARD
    for target, row in (
        ("flash_attn_interface:flash_attn_func", standin_flash_attn.FA3_FUNC),
        ("flash_attn_interface:flash_attn_varlen_func", standin_flash_attn.FA3_VARLEN_FUNC),
    ):
        assert row == real_schemas.recorded_row("fa3", target)


def test_mutated_arguments_are_read_from_the_alias_marks() -> None:
    schema = "ns::f(Tensor a, Tensor(a1!)? b=None, Tensor c, Tensor(x!) d) -> (Tensor(x!), Tensor)"
    assert real_schemas.mutated_arguments(schema) == ("b", "d")
