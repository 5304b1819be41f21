"""The GPU libraries' wheels built here (``launchers/kernel_build.sh``), found and loaded on a CPU.

A built extension links torch's CUDA libraries (FA3's ``_C.abi3.so`` needs ``libtorch_cuda.so``
and ``libcudart.so.13``), which the CPU torch of ``.venv`` does not ship; the build's toolchain
venv (torch 2.11.0+cu130 with its CUDA wheels) does, and loads the extension without a GPU. So
a test in ``.venv`` finds the cached wheel and the toolchain (`cached`), unpacks the wheel once
(`site_of`) and runs the checks of ``tests/realwheel/`` in the toolchain's Python
(`run_checks`); those checks then call `load_fa3` there, which imports the library's own Python
and real operators from the wheel and registers the CPU emulation on them.

When nothing is cached, `missing` is the one line a skipped test prints: the command that
builds it. CI never builds (its 30 minutes), so there the tests that need a wheel skip.
Standard library at import time: this module is imported by both interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LCAB_CACHE", Path.home() / ".cache" / "lcab"))
TOOLCHAIN = CACHE / "build" / "toolchain-py312-torch2.11.0-cu130"
"""The build venv of ``launchers/kernel_build.sh`` (its ``TOOLCHAIN``; move them together)."""
SITE_ENV = "LCAB_REAL_WHEEL_SITE"
"""Where `run_checks` tells the checks the unpacked wheel is."""
BUILD_COMMAND = {
    "fa3": "bash launchers/wheelhouse.sh build fa3 --src DIR  (DIR: a flash-attention checkout "
    "at the pinned commit with csrc/cutlass; about 6 minutes on 2 cores)",
    "flashmask": "bash launchers/wheelhouse.sh build flashmask --src DIR  (DIR: a "
    "PaddlePaddle/flash-attention checkout at the pinned commit with FlashMask V3's cutlass; "
    "about 20 minutes on 2 cores)",
    "ffa": "bash launchers/wheelhouse.sh build ffa --src DIR  (DIR: a MagiAttention checkout at "
    "the pinned commit with its cutlass; about 40 minutes on 2 cores)",
    "bsa": "bash launchers/wheelhouse.sh build bsa --src DIR  (DIR: a Block-Sparse-Attention "
    "checkout at the pinned commit with its cutlass; about 23 minutes on 2 cores)",
}


@dataclass(frozen=True)
class CachedBuild:
    """One wheel in ``~/.cache/lcab/wheels/NAME/KEY/`` and its ``build.json``."""

    folder: Path
    facts: dict[str, Any]

    @property
    def wheel(self) -> Path:
        return self.folder / self.facts["wheel"]


def cached(name: str, commit: str | None = None) -> CachedBuild | None:
    """The newest cached build of ``name`` (of ``commit`` when given) whose toolchain is here."""
    if not (TOOLCHAIN / "bin" / "python").exists():
        return None
    found = []
    for facts_file in (CACHE / "wheels" / name).glob("*/build.json"):
        facts = json.loads(facts_file.read_text())
        wheel = facts_file.parent / facts["wheel"]
        if wheel.exists() and (commit is None or facts["commit"] == commit):
            found.append(CachedBuild(facts_file.parent, facts))
    return max(found, key=lambda b: b.facts["built"], default=None)


def missing(name: str) -> str:
    """The one line a test that needs the wheel prints when it is not cached."""
    return f"no {name} wheel cached in {CACHE / 'wheels' / name}: {BUILD_COMMAND[name]}"


def site_of(build: CachedBuild) -> Path:
    """The wheel unpacked (once) into a folder to put on ``sys.path``."""
    site = build.folder / "site"
    stamp = site / ".lcab-unpacked"
    if not stamp.exists() or stamp.read_text() != build.facts["wheel_sha256"]:
        with zipfile.ZipFile(build.wheel) as wheel:
            wheel.extractall(site)
        stamp.write_text(build.facts["wheel_sha256"])
    return site


def run_checks(build: CachedBuild, checks: str, *pytest_args: str) -> subprocess.CompletedProcess:
    """``pytest CHECKS`` in the toolchain's Python with the wheel's site and the repository.

    ``tests/conftest.py`` imports Hydra, which the toolchain does not have: the checks run
    without conftest files and with the project's addopts cleared (they need none of them).
    """
    env = {**os.environ, SITE_ENV: str(site_of(build)), "PYTHONPATH": str(ROOT)}
    command = [str(TOOLCHAIN / "bin" / "python"), "-m", "pytest", checks, "-q", "--noconftest"]
    command += ["-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore::UserWarning"]
    return subprocess.run(
        [*command, *pytest_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


# ----------------------------------------------------------------------------- in the toolchain
_LOADED: dict[str, Any] = {}


def load_fa3() -> Any:
    """FA3's own ``flash_attn_interface`` from the unpacked wheel, running on the CPU.

    Its extension ``flash_attn_3._C`` registers the real ``flash_attn_3::fwd``/``bwd`` with
    CUDA kernels only; the emulation (`tests.helpers.emulated_flash_attn_3`) is registered as
    their CPU kernels, and the library's Python custom ops (``_flash_attn_forward``/
    ``_backward``, ``device_types="cuda"``) get their own bodies for CPU, as FA2's loader does.
    Everything else — the autograd functions, padding, reshapes, the ops' schemas — is the
    library's. Once per process.
    """
    if "fa3" in _LOADED:
        return _LOADED["fa3"]
    import torch

    from tests.helpers import emulated_flash_attn_3

    sys.path.insert(0, os.environ[SITE_ENV])
    import flash_attn_interface  # type: ignore[import-not-found]

    library = torch.library.Library("flash_attn_3", "IMPL")  # kept alive below
    library.impl("fwd", emulated_flash_attn_3.fwd, "CPU")
    library.impl("bwd", emulated_flash_attn_3.bwd, "CPU")
    for name in ("_flash_attn_forward", "_flash_attn_backward"):
        opdef = getattr(flash_attn_interface, name)
        opdef.register_kernel("cpu")(opdef._init_fn)
    _LOADED["fa3"], _LOADED["fa3-library"] = flash_attn_interface, library
    return flash_attn_interface


def load_flashmask() -> Any:
    """FlashMask's own ``interface_torch`` from the unpacked wheel, running on the CPU.

    Its extension ``flashmask._C`` registers the real ``flashmask::fwd``/``bwd`` (CUDA kernels
    only, ``TORCH_LIBRARY_IMPL(flashmask, CUDA, m)``); the stand-in's kernels
    (`tests.helpers.standin_flashmask`, which then defines no ops of its own) are registered as
    their CPU kernels. ``flashmask_attention``, ``FlashMaskFunc`` and the op schemas are the
    library's. Once per process.
    """
    if "flashmask" in _LOADED:
        return _LOADED["flashmask"]
    import torch

    sys.path.insert(0, os.environ[SITE_ENV])
    import interface_torch  # type: ignore[import-not-found]

    from tests.helpers import standin_flashmask

    library = torch.library.Library("flashmask", "IMPL")
    library.impl("fwd", standin_flashmask._fwd, "CPU")
    library.impl("bwd", standin_flashmask._bwd, "CPU")
    _LOADED["flashmask"], _LOADED["flashmask-library"] = interface_torch, library
    return interface_torch


def load_ffa() -> Any:
    """MagiAttention's own ``magi_attention.functional`` from the unpacked wheel, on the CPU.

    Its Python defines the ``flex_flash_attn::_flex_flash_attn_forward_compilable`` and
    ``_backward_compilable`` custom ops with CUDA and Meta kernels over its compiled modules;
    the emulation (`tests.helpers.emulated_magi_ffa`) is registered as their CPU kernels.
    ``flex_flash_attn_func``, its autograd function and buffers, the range checks and the
    pybind extension ``magi_attn_ext`` are the library's. Once per process.
    """
    if "ffa" in _LOADED:
        return _LOADED["ffa"]
    import importlib

    import torch

    from tests.helpers import emulated_magi_ffa

    sys.path.insert(0, os.environ[SITE_ENV])
    functional = importlib.import_module("magi_attention.functional")
    for op, kernel in (("forward", emulated_magi_ffa.fwd), ("backward", emulated_magi_ffa.bwd)):
        torch.library.register_kernel(
            f"flex_flash_attn::_flex_flash_attn_{op}_compilable", "cpu", kernel
        )
    _LOADED["ffa"] = functional
    return functional


def load_bsa() -> Any:
    """Block-Sparse-Attention's own ``block_sparse_attn_interface`` from the wheel, on the CPU.

    Its Python defines the ``flash_attn::_block_sparse_attn_forward``/``_backward`` custom ops
    (CUDA only) over the pybind extension ``block_sparse_attn_cuda``, which it imports (the real
    one loads here); the extension's emulation (`tests.helpers.emulated_block_sparse_attn_cuda`,
    from the binding's C++) replaces it in the interface module, and the ops get their own
    bodies as CPU kernels. ``block_sparse_attn_func``, its autograd function, the head-type
    renumbering and the block-mask conversions are the library's. Once per process.
    """
    if "bsa" in _LOADED:
        return _LOADED["bsa"]
    import importlib

    from tests.helpers import emulated_block_sparse_attn_cuda

    sys.path.insert(0, os.environ[SITE_ENV])
    interface = importlib.import_module("block_sparse_attn.block_sparse_attn_interface")
    real = interface.block_sparse_attn_cuda
    assert {"fwd_block", "bwd_block"} <= set(dir(real))  # what is replaced is what exists
    interface.block_sparse_attn_cuda = emulated_block_sparse_attn_cuda
    for name in ("_block_sparse_attn_forward", "_block_sparse_attn_backward"):
        opdef = getattr(interface, name)
        opdef.register_kernel("cpu")(opdef._init_fn)
    _LOADED["bsa"] = interface
    return interface
