"""lcab's rows and stand-ins held to the real builds' recorded interfaces, in every CI run.

``tests/unit/data/real_schemas/{fa3,flashmask,ffa,bsa,fa2}.json`` were read from FA3,
FlashMask, MagiAttention's FFA, Block-Sparse-Attention and FA2 as
``launchers/kernel_build.sh`` builds them — each extension loaded (torch 2.11.0+cu130 on a CPU)
and its own Python imported — by ``bash launchers/kernel_build.sh schemas NAME``. Every row lcab
calls through must say what its file says (parameters, defaults, keyword-only ones, kind of
object, op name, mutated arguments), each file must be of the build its recipe pins, and the FA3
stand-in's functions and backward op and the FlashMask stand-in's ``fwd``/``bwd`` ops are built
from the files (`tests.helpers.standin_flash_attn`, `tests.helpers.standin_flashmask`), so
neither side can be lcab's reading checked against itself. ``tests/unit/test_real_wheels.py``
re-reads the live build when it is cached here.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import torch

from lcab.kernels import flash_backward
from lcab.kernels.upstream import block_sparse_attn as bsa_table
from lcab.kernels.upstream import flash_attn as table
from lcab.kernels.upstream import flashmask as flashmask_table
from lcab.kernels.upstream import magi_ffa as ffa_table
from lcab.kernels.upstream.facts import UpstreamFunction
from tests.helpers import real_schemas, standin_flash_attn

ROOT = Path(__file__).resolve().parents[2]
ROWS = {
    ("fa3", "flash_attn_interface:flash_attn_func"): table.FA3_FUNC,
    ("fa3", "flash_attn_interface:flash_attn_varlen_func"): table.FA3_VARLEN_FUNC,
    ("fa3", "flash_attn_interface:_flash_attn_backward"): table.FA3_BACKWARD,
    ("flashmask", "interface_torch:flashmask_attention"): flashmask_table.FLASHMASK_ATTENTION,
    ("flashmask", "interface_torch:flashmask_cuda.fwd"): flashmask_table.FLASHMASK_FWD,
    ("flashmask", "interface_torch:flashmask_cuda.bwd"): flashmask_table.FLASHMASK_BWD,
    ("ffa", "magi_attention.functional:flex_flash_attn_func"): ffa_table.FFA_FUNC,
    (
        "ffa",
        "magi_attention.functional.flex_flash_attn:_flex_flash_attn_backward",
    ): ffa_table.FFA_BACKWARD,
    ("bsa", "block_sparse_attn:block_sparse_attn_func"): bsa_table.BLOCK_SPARSE_ATTN_FUNC,
    ("fa2", "flash_attn:flash_attn_func"): table.FA2_FUNC,
    ("fa2", "flash_attn:flash_attn_varlen_func"): table.FA2_VARLEN_FUNC,
    ("fa2", "flash_attn.flash_attn_interface:_flash_attn_backward"): table.FA2_BACKWARD,
    (
        "fa2",
        "flash_attn.flash_attn_interface:_flash_attn_varlen_backward",
    ): table.FA2_VARLEN_BACKWARD,
}
KERNELS = sorted({kernel for kernel, _ in ROWS})
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


@pytest.mark.parametrize(("kernel", "target"), sorted(ROWS), ids=lambda key: str(key))
def test_lcabs_rows_are_the_built_library(kernel: str, target: str) -> None:
    assert differences(ROWS[kernel, target], real_schemas.recorded_row(kernel, target)) == []


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
    if "==" in source:  # a PyPI sdist (fa2): the build names the archive it unpacked
        dist, version = source.split("==")
        return f"sdist {dist.replace('-', '_')}-{version}.tar.gz", {}, flags
    return source.split("@")[1], dict(s.split("=", 1) for s in submodules), flags


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_record_is_of_the_build_the_recipe_pins(kernel: str) -> None:
    """A recipe changed without re-recording (``kernel_build.sh schemas NAME``) fails here."""
    provenance = real_schemas.load(kernel)["provenance"]
    commit, submodules, flags = recipe(kernel)
    if commit.startswith("sdist "):
        assert provenance["commit"].startswith(commit + " sha256:")
    else:
        assert provenance["commit"] == commit
    assert provenance["submodules"] == submodules
    assert provenance["flags"] == flags
    assert provenance["toolchain"]["torch"] == "2.11.0+cu130"  # the GPU image's torch
    assert provenance["toolchain"]["arch"] == "sm_90a"


def test_the_compiled_ops_run_on_cuda_only() -> None:
    """Why a CPU run needs the emulation registered (`tests.helpers.real_wheels`)."""
    operators = real_schemas.load("fa3")["operators"] | real_schemas.load("flashmask")["operators"]
    for name in ("flash_attn_3::fwd", "flash_attn_3::bwd", "flashmask::fwd", "flashmask::bwd"):
        assert operators[name]["kernels"] == ["CUDA"], name
    assert operators["flash_attn_3::bwd"]["mutates"] == ["dq", "dk", "dv"]
    assert operators["flashmask::fwd"]["mutates"] == ["k_new", "v_new", "out"]


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


def test_the_flashmask_standin_defines_its_ops_from_the_record() -> None:
    from tests.helpers import standin_flashmask

    for name in ("fwd", "bwd"):
        live = str(getattr(torch.ops.flashmask, name).default._schema)
        assert live == real_schemas.load("flashmask")["operators"][f"flashmask::{name}"]["schema"]
    assert standin_flashmask.SCHEMAS["bwd"].startswith("bwd(Tensor dout, Tensor q")


def test_mutated_arguments_are_read_from_the_alias_marks() -> None:
    schema = "ns::f(Tensor a, Tensor(a1!)? b=None, Tensor c, Tensor(x!) d) -> (Tensor(x!), Tensor)"
    assert real_schemas.mutated_arguments(schema) == ("b", "d")
