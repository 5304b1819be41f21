"""The FA4, FlashInfer and TransformerEngine tables held to the installed packages themselves.

``launchers/setup.sh`` installs the pins of the ``upstream`` extra with ``--no-deps`` into
``.venv/lcab-upstream`` (outside lcab's import path). Every row of `lcab.kernels.upstream.fa4`,
``.flashinfer`` and ``.cudnn`` must then state the installed function's parameters in order,
their defaults and keyword-only marks — read with ``inspect.signature`` in a subprocess where
the package imports without a GPU (flashinfer), and from the installed file's AST where it does
not (flash-attn-4 needs ``cutlass``; TE's wheel without its 276 MB core raises on import) — and
cite lines of that file that hold the definition. Every registered kernel's probe must ask only
for functions and keywords a table states.

Block-Sparse-Attention and fastvideo-kernel do not install on a CPU machine (a CUDA source
build; fastvideo-kernel's only wheel is CPython 3.12 pinning torch 2.12). Their rows are held to
their sources by the same AST comparison when ``LCAB_UPSTREAM_SOURCES`` names a folder holding
``mit-han-lab+Block-Sparse-Attention`` (a checkout of the cited commit) and
``hao-ai-lab+FastVideo`` (with ``fastvideo-kernel/`` from the cited sdist); skipped otherwise.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lcab.kernels import KERNELS, upstream
from lcab.kernels.packages import ApiNeed, PackageProbe
from lcab.kernels.upstream import block_sparse_attn, cudnn, fa4, flashinfer, vsa
from lcab.kernels.upstream.facts import UpstreamFunction
from tests.helpers.upstream_source import definition, kind_of, signature_of

TARGET = Path(os.environ.get("LCAB_UPSTREAM_TARGET", Path(sys.prefix) / "lcab-upstream"))
TABLES = [
    importlib.import_module(f"{upstream.__name__}.{info.name}")
    for info in pkgutil.iter_modules(upstream.__path__)
]
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
_EXTRA = re.search(r"^upstream = \[(.*?)^\]", PYPROJECT.read_text(), re.M | re.S)
#: The pins of pyproject.toml's ``upstream`` extra, which setup.sh installs into TARGET.
PINNED = dict(re.findall(r'"([\w.-]+)==([^"]+)"', _EXTRA.group(1) if _EXTRA else ""))
#: The tables of a library the upstream extra installs, at the version the table read.
INSTALLED_TABLES = [t for t in TABLES if getattr(t, "DISTRIBUTION", None) in PINNED]
SOURCE_TABLES = (block_sparse_attn, vsa)
#: Every row of every table in lcab.kernels.upstream, by (module, name).
ROWS: dict[tuple[str, str], UpstreamFunction] = {
    (row.module, row.name): row
    for table in TABLES
    for row in vars(table).values()
    if isinstance(row, UpstreamFunction)
}
#: Each registered kernel's package and the functions it needs (registry-driven).
NEEDS = [
    (name, kernel.caps.requires, need)
    for name, kernel in ((n, KERNELS.get(n)) for n in KERNELS.names())
    if kernel.caps.requires is not None
    for need in kernel.caps.requires.needs
]

Signature = dict[str, Any]
"""{"params": [...], "defaults": {name: repr}, "keyword_only": [...]}."""

_INSPECT = r"""
import importlib, inspect, json, sys
out = {}
for qualname in sys.argv[1:]:
    module, name = qualname.split(":")
    try:
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
        kind = "custom_op" if type(target).__name__ == "CustomOpDef" else "function"
        if kind == "custom_op":
            target = target._init_fn
        params = [p for p in inspect.signature(target).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except Exception as err:
        out[qualname] = {"error": f"{type(err).__name__}: {err}"}
        continue
    out[qualname] = {
        "kind": kind,
        "params": [p.name for p in params],
        "defaults": {p.name: repr(p.default) for p in params if p.default is not p.empty},
        "keyword_only": [p.name for p in params if p.kind is p.KEYWORD_ONLY],
    }
print(json.dumps(out))
"""


def cited(row: UpstreamFunction) -> tuple[str, int, int]:
    """(path, first line, last line) of ``owner/repo@version:path:La-b``."""
    _, path, lines = row.source.rsplit(":", 2)
    first, last = lines.removeprefix("L").split("-")
    return path, int(first), int(last)


def row_signature(row: UpstreamFunction) -> Signature:
    return {
        "params": list(row.params),
        "defaults": {name: repr(value) for name, value in row.defaults.items()},
        "keyword_only": list(row.keyword_only),
    }


def ast_signature(node: ast.FunctionDef, drop_self: bool) -> Signature:
    """A ``def``'s parameters (`tests.helpers.upstream_source`) in this file's comparable form."""
    sig = signature_of(node, drop_self)
    return {
        "params": list(sig.params),
        "defaults": {name: repr(value) for name, value in sig.defaults.items()},
        "keyword_only": list(sig.keyword_only),
    }


def source_signature(root: Path, row: UpstreamFunction) -> tuple[Signature, int]:
    """The row's function as the file it cites defines it, and its ``def`` line."""
    path, _, _ = cited(row)
    node, drop_self = definition(ast.parse((root / path).read_text()), row.name)
    return ast_signature(node, drop_self), node.lineno


def source_kind(root: Path, row: UpstreamFunction) -> str:
    """The row's kind as the cited file's decorators make it (`upstream_source.kind_of`)."""
    path, _, _ = cited(row)
    node, _ = definition(ast.parse((root / path).read_text()), row.name)
    return kind_of(node).kind


# ----------------------------------------------------------------------------- installed
@pytest.fixture(scope="module")
def target() -> Path:
    if not TARGET.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{TARGET} is missing: launchers/setup.sh installs it")
        pytest.skip(f"{TARGET} is missing (run launchers/setup.sh)")
    return TARGET


@pytest.fixture(scope="module")
def inspected(target: Path) -> dict[str, Any]:
    """``inspect.signature`` of every installed row, imported in a subprocess from ``target``."""
    names = [f"{row.module}:{row.name}" for table in INSTALLED_TABLES for row in table.ROWS]
    env = os.environ | {"PYTHONPATH": str(target), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", _INSPECT, *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def installed_version(target: Path, distribution: str) -> str | None:
    for dist in importlib.metadata.distributions(path=[str(target)]):
        if dist.metadata["Name"].lower().replace("_", "-") == distribution:
            return dist.version
    return None


@pytest.mark.parametrize("table", INSTALLED_TABLES, ids=lambda t: t.DISTRIBUTION)
def test_the_installed_version_is_the_one_the_table_read(table: ModuleType, target: Path) -> None:
    assert installed_version(target, table.DISTRIBUTION) == table.VERSION


@pytest.mark.parametrize(
    "row", [r for t in INSTALLED_TABLES for r in t.ROWS], ids=lambda r: r.qualname
)
def test_row_matches_the_installed_package(
    row: UpstreamFunction, target: Path, inspected: dict[str, Any]
) -> None:
    """Imported where it imports on a CPU, else read from the installed file."""
    from_source, line = source_signature(target, row)
    real = dict(inspected[f"{row.module}:{row.name}"])
    if "error" in real:  # no import without a GPU: the installed file is the package
        real = from_source | {"kind": source_kind(target, row)}
    assert real.pop("kind") == row.kind, "a plain function or a torch custom op, as defined"
    assert row_signature(row) == real
    _, first, last = cited(row)
    assert first <= line <= last, f"{row.source} cites lines that do not hold the def (L{line})"


def test_flashinfer_is_compared_by_import_and_the_others_by_source(
    inspected: dict[str, Any],
) -> None:
    """Which of the comparisons above read ``inspect.signature`` (says what the run checked)."""
    imported = {name.split(":")[0] for name, real in inspected.items() if "error" not in real}
    assert imported == {flashinfer.MODULE}


def test_the_comparison_catches_a_wrong_row(target: Path) -> None:
    """A row without FA4's b36 keyword ``gather_bwd_token_chunk`` does not match the file."""
    params = fa4.FLASH_ATTN_FUNC.params[:-1]
    defaults = {k: v for k, v in fa4.FLASH_ATTN_FUNC.defaults.items() if k in params}
    old = UpstreamFunction(
        fa4.MODULE, "flash_attn_func", params, fa4.FLASH_ATTN_FUNC.source, defaults
    )
    assert row_signature(old) != source_signature(target, old)[0]


#: Facts beyond the signatures that the adapters and stand-ins rely on, as text of the installed
#: files: (table, file, text, the fact it shows).
SOURCE_FACTS = (
    (fa4, "flash_attn/cute/interface.py",
     "lse_shape = (batch_size, num_head, seqlen_q) if cu_seqlens_q is None"
     " else (num_head, total_q)",
     "LSE layouts (B, H, Sq) dense and (H, total_q) varlen"),
    (fa4, "flash_attn/cute/interface.py",
     "and window_size_left < 0 and window_size_right < 0):",
     "only two negative window sides are no window"),
    (fa4, "flash_attn/cute/interface.py", "if not ctx.return_lse:\n            dlse = None",
     "dlse reaches the backward when return_lse=True"),
    (fa4, "flash_attn/cute/softmax.py",
     "(row_max_scaled + cute.math.log2(row_sum_cur, fastmath=True)) * LN2",
     "the LSE is natural log (base-2 sum times ln 2)"),
    (fa4, "flash_attn/cute/softmax.py", "else -Float32.inf", "-inf on rows with nothing"),
    (flashinfer, "flashinfer/sparse.py",
     "(q.size(0), q.size(1)), dtype=torch.float32, device=q.device",
     "float32 LSE of q's first two dims: (M, Hq) for the BSR wrapper"),
    (flashinfer, "flashinfer/sparse.py",
     '"(num_kv_heads qo_len) gqa_group_size -> (num_kv_heads gqa_group_size) qo_len"',
     "the variable wrapper's LSE comes back (Hq, S)"),
    (flashinfer, "flashinfer/data/include/flashinfer/attention/prefill.cuh",
     "math::ptx_log2(d[mma_q][j]) + float(m[mma_q][j])", "the LSE is in log2 units"),
    (cudnn,
     "transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py",
     "If `None`, it will be set to `False` for `attn_mask_type` =",
     "causal masks align top-left unless told otherwise"),
)  # fmt: skip


@pytest.mark.parametrize(
    ("table", "path", "text", "fact"), SOURCE_FACTS, ids=[f[3] for f in SOURCE_FACTS]
)
def test_fact_is_in_the_installed_source(
    table: ModuleType, path: str, text: str, fact: str, target: Path
) -> None:
    assert installed_version(target, table.DISTRIBUTION) == table.VERSION
    assert text in (target / path).read_text(), fact


# ----------------------------------------------------------------------------- sources only
def _source_root(row: UpstreamFunction) -> Path:
    folder = os.environ.get("LCAB_UPSTREAM_SOURCES")
    if not folder:
        pytest.skip("set LCAB_UPSTREAM_SOURCES to check Block-Sparse-Attention and VSA rows")
    repo = row.source.split("@")[0].replace("/", "+")
    return Path(folder) / repo


@pytest.mark.parametrize(
    "row", [r for t in SOURCE_TABLES for r in t.ROWS], ids=lambda r: r.qualname
)
def test_row_matches_the_cited_source(row: UpstreamFunction) -> None:
    real, line = source_signature(_source_root(row), row)
    assert row_signature(row) == real
    assert source_kind(_source_root(row), row) == row.kind
    _, first, last = cited(row)
    assert first <= line <= last


# ----------------------------------------------------------------------------- adapters


@pytest.mark.parametrize(
    ("kernel", "package", "need"), NEEDS, ids=[f"{k}-{need.function}" for k, _, need in NEEDS]
)
def test_each_probe_asks_only_what_its_table_states(
    kernel: str, package: PackageProbe, need: ApiNeed
) -> None:
    """The function is a row; its keywords are the row's; nothing required goes unpassed."""
    row = ROWS.get((package.module, need.function))
    assert row is not None, f"{kernel} probes {package.module}.{need.function}: in no table"
    assert set(need.params) <= set(row.params), set(need.params) - set(row.params)
    assert need.positional is not None, "state how many arguments go by position"
    by_position = [p for p in row.params if p not in row.keyword_only][: need.positional]
    required = [p for p in row.params if p not in row.defaults]
    assert set(required) <= set(by_position) | set(need.params)
