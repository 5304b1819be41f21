"""The FlashMask table (`lcab.kernels.upstream.flashmask`) held to FlashMask's own source.

FlashMask is not on PyPI and builds only with CUDA, so no CPU machine has the package. Two kinds
of check:

* always: the adapter and the stand-in take what they use from the rows (keywords among the
  row's parameters, the stand-in's signatures are the rows', the module name and LSE layout);
* when a checkout of ``flashmask/flash_mask/flashmask_attention_v3/`` at the table's commit is
  given in ``LCAB_FLASHMASK_SRC`` (a directory with ``interface_torch.py``,
  ``flash_api_torch.cpp``, ``setup_torch.py`` and ``mainloop_fwd_sm90_tma_gmma_ws.hpp``): every
  row against that source — the Python function by its AST, the ``fwd``/``bwd`` ops by parsing
  the schemas the C++ registers with torch's own schema parser — and the facts the adapter
  relies on (module name, ``dlse`` unused, absolute row intervals).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
import torch

from lcab.kernels import flash_backward
from lcab.kernels import flashmask as adapter
from lcab.kernels.upstream import flashmask as table
from lcab.kernels.upstream.facts import UpstreamFunction
from tests.helpers import standin_flashmask as standin
from tests.helpers.upstream_source import function_signature

SOURCE_ENV = "LCAB_FLASHMASK_SRC"


# ----------------------------------------------------------------------------- always
def test_rows_name_the_commit_and_the_module_the_torch_build_installs() -> None:
    for row in table.ROWS:
        assert row.source.startswith(f"{table.COMMIT}:{table.FM3}/"), row.qualname
        assert row.module == "interface_torch"
    assert adapter.FlashMaskKernel.caps.requires.module == table.MODULE
    assert adapter.FlashMaskKernel.caps.package == table.MODULE


def test_the_adapter_passes_only_what_the_rows_define() -> None:
    call, bwd = table.FLASHMASK_ATTENTION, table.FLASHMASK_BWD
    assert set(adapter.FLASHMASK_KWARGS) <= set(call.params[3:])
    assert set(adapter.BWD_KWARGS) <= set(bwd.params)
    assert call.lse is not None and call.lse.layout == "bhs" and not call.lse.differentiable
    needs = {need.function for need in adapter.FlashMaskKernel.caps.requires.needs}
    assert needs == {call.name, bwd.name}


def op_facts(schema: torch.FunctionSchema) -> tuple[str, tuple[str, ...], dict, tuple[str, ...]]:
    """(op name, parameters, defaults, mutated arguments) of an operator's schema."""
    args = schema.arguments
    return (
        schema.name,
        tuple(a.name for a in args),
        {a.name: a.default_value for a in args if a.has_default_value()},
        tuple(a.name for a in args if a.alias_info is not None and a.alias_info.is_write),
    )


def row_facts(row: UpstreamFunction) -> tuple[str, tuple[str, ...], dict, tuple[str, ...]]:
    return row.op, row.params, dict(row.defaults), row.mutates


@pytest.mark.parametrize("row", [table.FLASHMASK_FWD, table.FLASHMASK_BWD], ids=["fwd", "bwd"])
def test_the_standin_ops_are_torch_ops_as_the_rows_say(row: UpstreamFunction) -> None:
    """``torch.ops.flashmask.fwd/bwd`` (a ``TORCH_LIBRARY`` op, read by its schema)."""
    op = getattr(standin.flashmask_cuda, row.name.split(".")[-1])
    assert flash_backward.callable_kind(op) == row.kind == "library_op"
    assert flash_backward.mismatch(op, row) is None
    assert op_facts(op.default._schema) == row_facts(row)


# ----------------------------------------------------------------------------- against the source
@pytest.fixture(scope="module")
def src() -> Path:
    root = os.environ.get(SOURCE_ENV)
    if not root:
        pytest.skip(f"no FlashMask checkout given ({SOURCE_ENV}); FlashMask is not on PyPI")
    return Path(root)


def schema_of(cpp: str, op: str) -> torch.FunctionSchema:
    """The schema ``m.def("op(...) -> ...")`` registers, parsed by torch itself."""
    start = cpp.index(f'm.def("{op}(')
    body = cpp[start : cpp.index(");", cpp.index("->", start))]
    body = re.sub(r"//[^\n]*", "", body)  # commented-out arguments are not registered
    text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', body))
    return torch._C.parse_schema(f"flashmask::{text}")


def test_flashmask_attention_row_matches_interface_torch(src: Path) -> None:
    real = function_signature((src / "interface_torch.py").read_text(), "flashmask_attention")
    row = table.FLASHMASK_ATTENTION
    assert (real.params, real.defaults, real.keyword_only) == (
        row.params,
        dict(row.defaults),
        row.keyword_only,
    )


@pytest.mark.parametrize("row", [table.FLASHMASK_FWD, table.FLASHMASK_BWD], ids=["fwd", "bwd"])
def test_op_rows_match_the_schemas_the_extension_registers(row: UpstreamFunction, src: Path):
    schema = schema_of((src / "flash_api_torch.cpp").read_text(), row.name.split(".")[-1])
    assert op_facts(schema) == row_facts(row)  # name, parameters, defaults, mutated arguments
    assert len(schema.returns) == len(row.returns)


def test_the_source_check_can_fail(src: Path) -> None:
    """fwd's row is not bwd's schema: the comparison above has teeth."""
    schema = schema_of((src / "flash_api_torch.cpp").read_text(), "bwd")
    assert tuple(a.name for a in schema.arguments) != table.FLASHMASK_FWD.params


def test_flashmask_func_calls_the_ops_with_row_keywords_and_drops_dlse(src: Path) -> None:
    tree = ast.parse((src / "interface_torch.py").read_text())
    (func,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FlashMaskFunc"]
    methods = {n.name: n for n in func.body if isinstance(n, ast.FunctionDef)}
    calls = {
        call.func.attr: {kw.arg for kw in call.keywords}
        for call in ast.walk(func)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "flashmask_cuda"
    }
    assert calls["fwd"] <= set(table.FLASHMASK_FWD.params)
    assert calls["bwd"] <= set(table.FLASHMASK_BWD.params)
    assert {"out", "softmax_lse"} <= calls["bwd"]  # the statistics go in as given
    backward = methods["backward"]
    assert [a.arg for a in backward.args.args] == ["ctx", "dout", "dlse"]
    loads = {n.id for n in ast.walk(backward) if isinstance(n, ast.Name)}
    assert "dout" in loads and "dlse" not in loads
    assert re.search(r"^flashmask_cuda = torch\.ops\.flashmask$", ast.unparse(tree), re.M)


def test_the_torch_build_installs_interface_torch(src: Path) -> None:
    setup = (src / "setup_torch.py").read_text()
    assert 'py_modules=["interface_torch"]' in setup
    assert f'PACKAGE_NAME = "{table.DISTRIBUTION}"' in setup
    assert f'return "{table.VERSION}"' in setup
    assert 'name=f"{PACKAGE_NAME}._C"' in setup


def test_the_kernel_masks_absolute_row_intervals(src: Path) -> None:
    """``flashmask_apply`` compares the absolute row (block offset taken off the bounds) with
    each interval, one test per interval, no diagonal in sight."""
    mainloop = (src / "mainloop_fwd_sm90_tma_gmma_ws.hpp").read_text()
    apply = mainloop[mainloop.index("void flashmask_apply(") : mainloop.index("mma(Params")]
    assert "int lts = s_lt_start[col_idx] - m_block;" in apply and "m_block *= kBlockM;" in apply
    assert "(row_idx >= lts && row_idx < lte) || (row_idx >= uts && row_idx < ute)" in apply
    assert "(row_idx >= lts) || (row_idx < ute)" in apply
    assert "col_idx >" not in apply and "row_idx > col" not in apply
