"""The planner, the dry run and the registries never load torch; `lcab.lazy` loads it on first use.

Loading torch was 2-3 s of a 6-9 s planner command (issue 50). Each check runs in a fresh
interpreter, where an import hook refuses torch and names the lcab frame that asked for it, so
a module that reads torch at import time (a base class, a default, a constant) fails here with
its file and line rather than silently costing every command two seconds.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lcab.lazy import lazy_module

ROOT = Path(__file__).resolve().parents[2]

REFUSE_TORCH = textwrap.dedent(
    """
    import importlib.abc, sys, traceback

    class RefuseTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch" or name.startswith("torch."):
                frames = [f for f in traceback.extract_stack() if "/lcab/" in f.filename]
                if any(f.filename.endswith(ALLOW_TORCH_FROM) for f in frames if ALLOW_TORCH_FROM):
                    return None
                where = ", ".join(f"{f.filename.split('/lcab/')[-1]}:{f.lineno}" for f in frames)
                print(f"REFUSED: torch imported from {where}", file=sys.stderr)
                raise ImportError(f"torch imported from {where}")

    sys.meta_path.insert(0, RefuseTorch())
    """
)


def run_without_torch(
    code: str, cwd: Path = ROOT, allow_from: str = ""
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that refuses to import torch (but from ``allow_from``)."""
    allow = f"ALLOW_TORCH_FROM = {allow_from!r}\n"
    return subprocess.run(
        [sys.executable, "-c", allow + REFUSE_TORCH + textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    "module",
    ["lcab.plan.app", "lcab.config.schema", "lcab.kernels", "lcab.cp", "lcab.launch.dry_run"],
)
def test_importing_the_registries_and_the_planner_loads_no_torch(module: str) -> None:
    done = run_without_torch(f"import {module}")
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_planner_predicts_a_sweep_without_torch(tmp_path: Path) -> None:
    """A two-job planner sweep (Ring and USP, one document mask) runs to its table."""
    done = run_without_torch(
        """
        import runpy
        sys.argv = ["lcab.plan", "-m", "cp=ring,usp", "topology=2x8", "mask=causal_document"]
        runpy.run_module("lcab.plan", run_name="__main__", alter_sys=True)
        """,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED" not in done.stderr, done.stderr[-3000:]  # not even where it was caught
    assert "ring" in done.stdout and "usp" in done.stdout and "TFLOP/s" in done.stdout


def test_the_dry_run_of_a_96_gpu_cell_loads_torch_only_for_its_schedule_check(
    tmp_path: Path,
) -> None:
    """A CUDA cell's kernel and machine checks on a host with no NVIDIA driver load no torch.

    The schedule check runs the strategy's own code on every rank (issue 61), so it alone
    may load torch; any other module that reads torch fails here with its file and line.
    """
    done = run_without_torch(
        """
        import runpy
        sys.argv = ["lcab.main", "launcher=slurm_h100_example", "cp=ring", "kernel=fa3",
                    "mask=causal_document", "topology=12x8", "problem.device=cuda", "dry_run=true"]
        runpy.run_module("lcab.main", run_name="__main__", alter_sys=True)
        """,
        cwd=tmp_path,
        allow_from="lcab/cp/schedule_check.py",
    )
    assert "REFUSED" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "96" in done.stdout and "ring" in done.stdout


def test_a_kernel_still_runs_with_torch_loaded_on_first_use() -> None:
    """The lazy names resolve when code runs: the tiled kernel under Ring All-Gather's module."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from lcab.kernels import Problem, get_kernel; "
            "from lcab.masks import make_mask; "
            "assert 'torch' not in sys.modules; "
            "p = Problem(64, 64, 2, 2, 16, 'float32', 'cpu'); "
            "assert get_kernel('ranges').not_supported_reasons(p) == []; "
            "assert 'torch' not in sys.modules; "
            "import torch; q = torch.randn(64, 2, 16); "
            "prepared = get_kernel('ranges').prepare(make_mask('causal', 64), Problem.of(q, q)); "
            "out, lse = prepared.run(q, q, q); print(tuple(out.shape), tuple(lse.shape))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["(64,", "2,", "16)", "(2,", "64)"]


def test_lazy_module_imports_on_first_read_and_rebinds_the_global() -> None:
    namespace: dict[str, object] = {}
    namespace["json"] = lazy_module("json", namespace)
    stand_in = namespace["json"]
    assert "json" in repr(stand_in) and "first use" in repr(stand_in)
    dumps = stand_in.dumps  # type: ignore[attr-defined]
    import json

    assert dumps is json.dumps
    assert namespace["json"] is json  # later reads go to the module itself


def test_lazy_module_binds_a_submodule_under_its_own_name() -> None:
    namespace: dict[str, object] = {}
    namespace["decoder"] = lazy_module("json.decoder", namespace, "decoder")
    error = namespace["decoder"].JSONDecodeError  # type: ignore[attr-defined]
    import json.decoder

    assert error is json.decoder.JSONDecodeError
    assert namespace["decoder"] is json.decoder


def test_a_stand_in_no_longer_bound_leaves_the_namespace_alone() -> None:
    """A name rebound by its module (a test's monkeypatch) is not overwritten by the stand-in."""
    namespace: dict[str, object] = {}
    stand_in = lazy_module("json", namespace)
    namespace["json"] = "patched"
    assert stand_in.loads("1") == 1
    assert namespace["json"] == "patched"


def test_setting_an_attribute_through_a_stand_in_sets_it_on_the_module() -> None:
    """``monkeypatch.setattr(module.dist, ...)`` before first use patches torch's module."""
    import types

    real = types.ModuleType("lcab_test_lazy_target")
    sys.modules[real.__name__] = real
    try:
        namespace: dict[str, object] = {}
        namespace["target"] = lazy_module(real.__name__, namespace, "target")
        namespace["target"].answer = 42  # type: ignore[attr-defined]
        assert real.answer == 42  # type: ignore[attr-defined]
        assert namespace["target"] is real
    finally:
        del sys.modules[real.__name__]
