"""The torch table (`lcab.kernels.upstream.torch_attention`) held to the installed torch.

Every row is compared with the real thing: Python functions by ``inspect.signature``, ATen and
custom ops by the schema torch registered for them (names in order, keyword-only, defaults,
return arity). The LSE layouts are not read from docs but from torch's own kernels: the ops run
on meta tensors and on fake CUDA tensors (``FakeTensorMode``), where torch's meta and fake
kernels decide the shapes, and the CPU op runs for real.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, varlen

from lcab.kernels.upstream import torch_attention as table
from lcab.kernels.upstream.facts import UpstreamFunction

#: Rows of public builtins whose schema is registered under an ATen name.
BUILTIN_OPS = {
    table.SDPA.qualname: "scaled_dot_product_attention",
    table.FUSED_SDP_CHOICE.qualname: "_fused_sdp_choice",
}
PYTHON_ROWS = [table.VARLEN_ATTN, table.VARLEN_AUX_REQUEST]
OP_ROWS = [row for row in table.ROWS if row not in PYTHON_ROWS]


def resolve(dotted: str) -> Any:
    """``torch.ops.aten._flash_attention_forward`` and the like, attribute by attribute."""
    head, *rest = dotted.split(".")
    assert head == "torch", dotted
    obj: Any = torch
    for part in rest:
        obj = getattr(obj, part)
    return obj


def schema_of(row: UpstreamFunction) -> torch.FunctionSchema:
    if row.qualname in BUILTIN_OPS:
        return getattr(torch.ops.aten, BUILTIN_OPS[row.qualname]).default._schema
    return resolve(row.qualname).default._schema


def shape_of(layout: str, batch: int, heads: int, seqlen: int) -> tuple[int, ...]:
    return {"bhs": (batch, heads, seqlen), "ht": (heads, seqlen), "th": (seqlen, heads)}[layout]


def test_every_row_names_torch_213_and_a_file() -> None:
    assert torch.__version__.startswith("2.13"), "the table was read from torch 2.13: re-read it"
    assert torch.version.git_version.startswith("cf30153c")
    for row in table.ROWS:
        assert row.source.startswith(table.TORCH + ":"), row.qualname


@pytest.mark.parametrize("row", PYTHON_ROWS, ids=lambda r: r.qualname)
def test_python_rows_match_the_installed_signature(row: UpstreamFunction) -> None:
    real = inspect.signature(getattr(__import__(row.module, fromlist=[row.name]), row.name))
    params = list(real.parameters.values())
    assert tuple(p.name for p in params) == row.params
    assert tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY) == row.keyword_only
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    assert defaults == dict(row.defaults)
    assert [(p.name, p.kind, p.default) for p in row.signature().parameters.values()] == [
        (p.name, p.kind, p.default) for p in params
    ]


@pytest.mark.parametrize("row", OP_ROWS, ids=lambda r: r.qualname)
def test_op_rows_match_the_registered_schema(row: UpstreamFunction) -> None:
    schema = schema_of(row)
    args = schema.arguments
    assert tuple(a.name for a in args) == row.params
    assert tuple(a.name for a in args if a.kwarg_only) == row.keyword_only
    assert {a.name: a.default_value for a in args if a.has_default_value()} == dict(row.defaults)
    assert len(schema.returns) == len(row.returns)
    if row.qualname in BUILTIN_OPS:  # the public name exists too
        assert callable(resolve(row.qualname))


def test_varlen_attn_lse_is_heads_by_tokens_from_torchs_own_fake_kernel() -> None:
    meta = torch.device("meta")
    q = torch.empty(10, 4, 16, dtype=torch.bfloat16, device=meta)
    k = torch.empty(12, 2, 16, dtype=torch.bfloat16, device=meta)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32, device=meta)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32, device=meta)
    aux = varlen.AuxRequest(lse=True)
    out, lse = varlen.varlen_attn(
        q, k, k, cu_q, cu_k, 6, 7, return_aux=aux, window_size=(-1, 0), enable_gqa=True
    )
    lse_fact = table.VARLEN_ATTN.lse
    assert lse_fact is not None and lse_fact.layout == "ht"
    assert out.shape == q.shape and lse.shape == shape_of(lse_fact.layout, 1, 4, 10)
    assert str(lse.dtype) == f"torch.{lse_fact.dtype}"
    with FakeTensorMode():  # the same on the device it runs on
        cuda = torch.device("cuda")
        qf = torch.empty(10, 4, 16, dtype=torch.bfloat16, device=cuda)
        kf = torch.empty(12, 2, 16, dtype=torch.bfloat16, device=cuda)
        cf = torch.tensor([0, 4, 10], dtype=torch.int32, device=cuda)
        ckf = torch.tensor([0, 5, 12], dtype=torch.int32, device=cuda)
        _, lse_fake = varlen.varlen_attn(qf, kf, kf, cf, ckf, 6, 7, return_aux=aux, enable_gqa=True)
        assert lse_fake.device.type == "cuda" and lse_fake.shape == (4, 10)


def test_the_varlen_custom_ops_and_flash_forward_agree_on_the_layouts() -> None:
    meta = torch.device("meta")
    q = torch.empty(10, 4, 16, dtype=torch.bfloat16, device=meta)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=meta)
    _, lse, _ = torch.ops.torch_attn._varlen_attn(q, q, q, cu, cu, 6, 6)
    assert lse.shape == shape_of(table.VARLEN_OP.lse.layout, 1, 4, 10)  # type: ignore[union-attr]
    flash = table.FLASH_FORWARD
    assert flash.lse is not None and flash.lse.varlen_layout is not None
    varlen_result = torch.ops.aten._flash_attention_forward(q, q, q, cu, cu, 6, 6, 0.0, True, False)
    assert len(varlen_result) == len(flash.returns)
    assert varlen_result[1].shape == shape_of(flash.lse.varlen_layout, 1, 4, 10)
    dense = torch.empty(2, 9, 4, 16, dtype=torch.bfloat16, device=meta)
    dense_result = torch.ops.aten._flash_attention_forward(
        dense, dense, dense, None, None, 9, 9, 0.0, False, False
    )
    assert dense_result[1].shape == shape_of(flash.lse.layout, 2, 4, 9)


def test_varlen_attn_backward_never_reads_the_lse_gradient() -> None:
    """The row says the LSE is not differentiable: torch's ``_backward`` ignores ``grad_lse``."""
    assert table.VARLEN_ATTN.lse is not None and not table.VARLEN_ATTN.lse.differentiable
    tree = ast.parse(textwrap.dedent(inspect.getsource(varlen._backward)))
    (fn,) = tree.body
    assert isinstance(fn, ast.FunctionDef)
    assert [a.arg for a in fn.args.args] == ["ctx", "grad_out", "grad_lse", "grad_rng"]
    loads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert "grad_out" in loads and "grad_lse" not in loads


def test_the_cpu_flash_op_lse_layout_and_its_empty_row_value() -> None:
    row = table.SDPA_FLASH_CPU
    assert row.lse is not None
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8)
    bias = torch.zeros(4, 5)
    bias[1] = float("-inf")  # row 1 attends no key
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, k, attn_mask=bias)
    assert lse.shape == shape_of(row.lse.layout, 1, 2, 4)
    assert torch.all(lse[0, :, 1] == float(row.lse.empty_rows)) and torch.all(out[0, :, 1] == 0)


def test_fused_sdp_choice_on_meta_and_fake_cuda() -> None:
    meta = torch.empty(1, 8, 128, 64, dtype=torch.bfloat16, device="meta")
    choice = torch._fused_sdp_choice(meta, meta, meta, None, 0.0, True)
    assert SDPBackend(choice) == SDPBackend.MATH  # the row's note
    if torch.backends.cuda.is_built():
        pytest.skip("a CUDA build answers fake CUDA tensors (MATH on an H100); CPU builds raise")
    with FakeTensorMode(), pytest.raises(RuntimeError, match="missing kernel for cuda"):
        q = torch.empty(1, 8, 128, 64, dtype=torch.bfloat16, device="cuda")
        torch._fused_sdp_choice(q, q, q, None, 0.0, True)


# ----------------------------------------------------------------------------- lcab's calls
def test_torch_varlen_adapter_takes_its_call_and_layout_from_the_row() -> None:
    from lcab.kernels import torch_varlen

    assert table.VARLEN_ATTN.module == torch_varlen.MODULE
    assert set(torch_varlen.CALL_KWARGS) <= set(table.VARLEN_ATTN.keyword_only)
    assert table.VARLEN_ATTN.lse is not None
    assert table.VARLEN_ATTN.lse.layout == torch_varlen.LSE_LAYOUT


def test_sdpa_calls_fit_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sdpa kernel's calls of ``torch._fused_sdp_choice`` and ``F.sdpa`` on its CUDA path
    (run on CPU tensors) bind to the rows, which the schema test holds to torch."""
    from lcab.kernels import Problem, get_kernel, sdpa
    from lcab.masks import make_mask

    bound: dict[str, dict[str, Any]] = {}

    def through(row: UpstreamFunction, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            bound[row.name] = row.bind(*args, **kwargs)  # TypeError if lcab's call does not fit
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(sdpa, "calls_cpu_flash_op", lambda backend, device: False)
    choice = through(table.FUSED_SDP_CHOICE, torch._fused_sdp_choice)
    monkeypatch.setattr(torch, "_fused_sdp_choice", choice)
    call = through(table.SDPA, torch.nn.functional.scaled_dot_product_attention)
    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", call)
    mask = make_mask("sliding_window", 32, window=5)
    prepared = get_kernel("sdpa").prepare(mask, Problem(32, 32, 4, 2, 8))
    q = prepared.to_native(torch.randn(32, 4, 8))
    k, v = (prepared.to_native(torch.randn(32, 2, 8)) for _ in "kv")
    prepared.run(q, k, v)
    assert bound[table.SDPA.name]["enable_gqa"] is True
    assert bound[table.FUSED_SDP_CHOICE.name]["attn_mask"] is not None
