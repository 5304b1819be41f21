"""launchers/kernel_build.sh and launchers/wheel_check.py: a wheel reaches the cache (and so the
GPU machine) only when it holds the GPU code its recipe promises and would import on the image.

The builds here are real but tiny: a recipe of the test's own (the script sourced, its ``recipe``
replaced) builds a package whose ``setup.py`` compiles one CUDA kernel into a Python extension
with the toolchain's nvcc (~10 s) and, like flash-attention's, builds no extension at all under
``FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE``. The checks are then held to the real FA3 wheel built
here (``../shared/wheels/fa3``) as well. Without the toolchain (``bash launchers/kernel_build.sh
toolchain``: ~5 minutes, 5 GB) these tests skip, as CI's machine has none.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.helpers import real_schemas, real_wheels

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launchers" / "kernel_build.sh"
CHECK = ROOT / "launchers" / "wheel_check.py"
TOOLCHAIN = real_wheels.TOOLCHAIN
FA3_WHEEL = next(  # the FA3 wheel built here, in the shared folder beside the checkout
    (p / "shared/wheels/fa3" / real_schemas.load("fa3")["provenance"]["wheel"]
     for p in ROOT.parents if (p / "shared/wheels/fa3").is_dir()),
    ROOT / "no-fa3-wheel",
)  # fmt: skip
needs_toolchain = pytest.mark.skipif(
    not (TOOLCHAIN / "bin" / "python").exists(),
    reason=f"no build toolchain in {TOOLCHAIN}: bash launchers/kernel_build.sh toolchain",
)

SETUP = """
import os, subprocess, sysconfig
from setuptools import setup
from setuptools.dist import Distribution

class Platform(Distribution):
    def has_ext_modules(self):  # a platform wheel, as a compiled library's is
        return True

if os.environ.get("FLASH_ATTENTION_SKIP_CUDA_BUILD") != "TRUE":  # flash-attention's switch
    arch = os.environ["TINY_ARCH"]
    command = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-I" + sysconfig.get_paths()["include"],
               f"-gencode=arch=compute_{arch},code=sm_{arch}", "tiny.cu", "-o", "tiny/_C.abi3.so"]
    if os.environ.get("TINY_LINK_PYTHON"):  # what MagiAttention's CMake did to magi_attn_ext
        command += ["-L" + sysconfig.get_config_var("LIBDIR"), "-lpython3.12"]
    subprocess.check_call(command)
setup(name="tiny", version="1.0", packages=["tiny"], package_data={"tiny": ["*.so"]},
      distclass=Platform)
if os.environ.get("TINY_FAIL_AFTER_WHEEL"):  # a build that fails once its wheel is written
    raise SystemExit(3)
"""
KERNEL = """
#include <Python.h>
__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
extern "C" PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""


def tiny_source(folder: Path, init: str = "from . import _C\n") -> Path:
    """The test library's checkout: ``setup.py``, its kernel and its package."""
    (folder / "tiny").mkdir(parents=True)
    (folder / "setup.py").write_text(SETUP)
    (folder / "tiny.cu").write_text(KERNEL)
    (folder / "tiny" / "__init__.py").write_text(init)
    return folder


def build_tiny(
    tmp_path: Path, recipe_env: str = "", init: str = "from . import _C\n", **planted: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """``build tiny`` through kernel_build.sh's own `build` with the test's recipe: its
    result and the cache folder of its wheels."""
    src, cache = tiny_source(tmp_path / "src", init), tmp_path / "cache"
    recipe = (
        "recipe() { REPO=test/tiny PIN='' SUBMODULES=() SETUP_DIR='' SETUP=setup.py "
        "NEEDS=(setup.py tiny.cu tiny) ABI=abi3 DIST=tiny SDIST='' PATCHES=() SASS=(sm_90a) "
        f'PTX=() IMPORTS=(tiny) RESTRICTIONS=("the test\'s") ENV=(TINY_ARCH=90a {recipe_env}); }}'
    )
    script = (
        f"source {shlex.quote(str(SCRIPT))}; CACHE={shlex.quote(str(cache))}; {recipe}; "
        f"build tiny --src {shlex.quote(str(src))} --jobs 1"
    )
    env = {k: v for k, v in os.environ.items() if k != "LCAB_CACHE"} | planted
    done = subprocess.run(
        ["nice", "-n", "19", "bash", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return done, cache / "wheels" / "tiny"


def cached_wheels(folder: Path) -> list[str]:
    """The wheels a later `make` would carry: those beside a build.json."""
    return [w.name for w in folder.glob("*/*.whl") if (w.parent / "build.json").exists()]


def check_wheel(wheel: Path, *args: str) -> subprocess.CompletedProcess:
    """wheel_check.py on ``wheel`` in the toolchain, with the FA3 recipe's promises."""
    cuobjdump = next(TOOLCHAIN.glob("lib/python3.12/site-packages/nvidia/cu13/bin/cuobjdump"))
    command = [str(TOOLCHAIN / "bin" / "python"), str(CHECK), str(wheel), "--name", "fa3",
               "--cuobjdump", str(cuobjdump), "--hide-dist", "versioningit", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_a_toolchain_with_a_cpu_torch_is_refused(tmp_path: Path) -> None:
    """`torch==2.11.0` is met by a ``+cpu`` build too; a wheel built on one would not load."""
    site = tmp_path / "lib" / "python3.12" / "site-packages" / "torch"
    site.mkdir(parents=True)
    results = {}
    for label, version, cuda in (("cpu", "2.11.0+cpu", "None"), ("cuda", "2.11.0+cu130", "'13.0'")):
        (site / "version.py").write_text(
            f"__version__ = '{version}'\ncuda: Optional[str] = {cuda}\n"
        )
        script = f"source {shlex.quote(str(SCRIPT))}; TOOLCHAIN={tmp_path}; toolchain_torch"
        results[label] = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert results["cpu"].returncode == 2
    assert "'2.11.0+cpu' (CUDA 'none'), not 2.11.0+cu130" in results["cpu"].stderr
    assert results["cuda"].returncode == 0, results["cuda"].stderr


@pytest.mark.slow
@needs_toolchain
def test_a_planted_skip_variable_is_cleared_and_the_wheel_holds_its_kernel(tmp_path: Path) -> None:
    done, wheels = build_tiny(
        tmp_path,
        FLASH_ATTENTION_SKIP_CUDA_BUILD="TRUE",
        MAGI_ATTENTION_SKIP_MAGI_ATTN_EXT_BUILD="1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cleared from the environment: " in done.stderr
    assert "FLASH_ATTENTION_SKIP_CUDA_BUILD" in done.stderr
    (wheel,) = wheels.glob("*/*.whl")
    assert "tiny/_C.abi3.so" in zipfile.ZipFile(wheel).namelist()
    checks = json.loads((wheel.parent / "build.json").read_text())["checks"]
    assert checks["passed"] and checks["device_code"] == {
        "tiny/_C.abi3.so": {"sass": ["sm_90a"], "ptx": []}
    }


@pytest.mark.slow
@needs_toolchain
def test_a_wheel_without_gpu_code_is_refused_and_not_cached(tmp_path: Path) -> None:
    """The switch reaching the build anyway (here: through the recipe) gives a Python-only
    wheel, which the check refuses: the build fails and nothing is cached."""
    done, wheels = build_tiny(tmp_path, "FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE")
    assert done.returncode == 2
    assert "no compiled extension in the wheel" in done.stderr and "refused" in done.stderr
    assert cached_wheels(wheels) == [] and list(wheels.glob("*/refused/*.whl"))


@pytest.mark.slow
@needs_toolchain
def test_a_failed_build_caches_nothing_even_with_a_wheel_written(tmp_path: Path) -> None:
    done, wheels = build_tiny(tmp_path, "TINY_FAIL_AFTER_WHEEL=1")
    assert done.returncode == 2 and "the build failed (exit 3)" in done.stderr
    assert not list(wheels.glob("*/*.whl"))


@pytest.mark.slow
@needs_toolchain
def test_a_wheel_for_another_architecture_is_refused(tmp_path: Path) -> None:
    done, wheels = build_tiny(tmp_path, "TINY_ARCH=80")
    assert done.returncode == 2
    assert "no sm_90a SASS in the wheel" in done.stderr
    assert "tiny/_C.abi3.so has device code for" in done.stderr and cached_wheels(wheels) == []


@pytest.mark.slow
@needs_toolchain
def test_a_wheel_that_links_libpython_is_refused(tmp_path: Path) -> None:
    """It imports here (the toolchain's Python has a shared libpython) but not on an image
    whose Python has none: the NEEDED check says so before the GPU does."""
    done, wheels = build_tiny(tmp_path, "TINY_LINK_PYTHON=1")
    assert done.returncode == 2
    assert "tiny/_C.abi3.so needs libpython3.12.so.1.0" in done.stderr
    assert cached_wheels(wheels) == []


@pytest.mark.slow
@needs_toolchain
def test_a_library_that_imports_a_build_only_package_is_refused(tmp_path: Path) -> None:
    done, wheels = build_tiny(tmp_path, init="import versioningit\nfrom . import _C\n")
    assert done.returncode == 2
    assert "No module named 'versioningit' (build-only: hidden)" in done.stderr
    assert cached_wheels(wheels) == []


@pytest.mark.slow
@needs_toolchain
@pytest.mark.skipif(not FA3_WHEEL.exists(), reason=f"no FA3 wheel at {FA3_WHEEL}")
def test_the_fa3_wheel_built_here_passes_and_its_broken_copies_do_not(tmp_path: Path) -> None:
    commit = real_schemas.load("fa3")["provenance"]["commit"]
    out = tmp_path / "findings.json"
    good = check_wheel(FA3_WHEEL, "--sass", "sm_90a", "--commit", commit, "--out", str(out))
    assert good.returncode == 0, good.stderr
    findings = json.loads(out.read_text())
    assert findings["schemas"] == "equal to tests/unit/data/real_schemas/fa3.json"
    assert findings["torch_abi"].startswith("stable: no torch C++ symbols")
    needed = set(findings["needed"]["flash_attn_3/_C.abi3.so"])
    assert needed >= {"libtorch_cuda.so", "libcudart.so.13"}

    blackwell = check_wheel(FA3_WHEEL, "--sass", "sm_100a")
    assert blackwell.returncode == 1 and "no sm_100a SASS in the wheel" in blackwell.stderr

    stripped = tmp_path / FA3_WHEEL.name  # the wheel with its extension removed
    with zipfile.ZipFile(FA3_WHEEL) as source, zipfile.ZipFile(stripped, "w") as target:
        for item in source.infolist():
            if not item.filename.endswith(".so"):
                target.writestr(item, source.read(item))
    bare = check_wheel(stripped, "--sass", "sm_90a")
    assert bare.returncode == 1 and "no compiled extension in the wheel" in bare.stderr
    assert "import failed" in bare.stderr  # flash_attn_3._C is gone


@pytest.mark.slow
@needs_toolchain
@pytest.mark.skipif(
    not os.environ.get("LCAB_FFA_SRC"),
    reason="LCAB_FFA_SRC names no MagiAttention checkout at the ffa recipe's pin",
)
def test_ffa_imports_on_the_image_once_patched(tmp_path: Path) -> None:
    """MagiAttention's own Python, patched by the ffa recipe, imports in the toolchain with no
    debugpy (the image has none) and its compiled ``magi_attn_ext`` emulated by an empty module
    (it is not built here); unpatched, the same import fails on debugpy."""
    results = {}
    for label in ("patched", "unpatched"):
        site, checkout = tmp_path / label, Path(os.environ["LCAB_FFA_SRC"])
        shutil.copytree(checkout / "magi_attention", site / "magi_attention")
        shutil.copy(checkout / "setup.py", site)  # the recipe patches it too
        script = f"source {shlex.quote(str(SCRIPT))}; recipe ffa; " + (
            f"apply_patches {shlex.quote(str(site))}" if label == "patched" else "true"
        )
        patched = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        assert patched.returncode == 0, patched.stderr
        code = (
            "import sys, types; sys.path.insert(0, sys.argv[1]); "
            "sys.modules['magi_attention.magi_attn_ext'] = types.ModuleType('magi_attn_ext'); "
            "import magi_attention.functional as f; print(f.flex_flash_attn_func.__name__)"
        )
        results[label] = subprocess.run(
            [str(TOOLCHAIN / "bin" / "python"), "-W", "ignore", "-c", code, str(site)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert results["patched"].returncode == 0, results["patched"].stderr[-2000:]
    assert results["patched"].stdout.strip() == "flex_flash_attn_func"
    assert "No module named 'debugpy'" in results["unpatched"].stderr


@pytest.mark.slow
@needs_toolchain
@pytest.mark.skipif(
    not os.environ.get("LCAB_FFA_SRC") or not shutil.which("cmake"),
    reason="LCAB_FFA_SRC names no MagiAttention checkout at the ffa recipe's pin (or no cmake)",
)
def test_ffa_extension_links_no_libpython_once_patched(tmp_path: Path) -> None:
    """``magi_attn_ext``'s link line as CMake writes it for the build (configured only, ~1
    minute; compiling it takes over an hour here): libpython3.12 unpatched, none patched; and
    its device code is CMake's architecture 90, SASS and PTX, as the recipe promises."""
    lines = {}
    for label in ("patched", "unpatched"):
        checkout = Path(os.environ["LCAB_FFA_SRC"])
        site = tmp_path / label
        shutil.copytree(checkout / "magi_attention", site / "magi_attention")
        shutil.copy(checkout / "setup.py", site)
        build = site / "magi_attention" / "csrc" / "extensions" / "build"
        build.mkdir()
        script = (
            f"source {shlex.quote(str(SCRIPT))}; recipe ffa; "
            + (f"apply_patches {shlex.quote(str(site))}; " if label == "patched" else "")
            + f"cd {shlex.quote(str(build))}; cuda=$(cuda_home); CUDA_HOME=$cuda "
            f"CUDACXX=$cuda/bin/nvcc PATH=$cuda/bin:$TOOLCHAIN/bin:$PATH cmake .. "
            f'-DCMAKE_PREFIX_PATH=$("$TOOLCHAIN/bin/python" -c "import torch; '
            f'print(torch.utils.cmake_prefix_path)") -DMAGI_CUDA_ARCHITECTURES=90 '
            f'-DPython3_EXECUTABLE="$TOOLCHAIN/bin/python"'
        )
        done = subprocess.run(
            ["nice", "-n", "19", "bash", "-c", script], capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        target = build / "CMakeFiles" / "magi_attn_ext.dir"
        lines[label] = (target / "link.txt").read_text().split()
        assert (
            "--generate-code=arch=compute_90,code=[compute_90,sm_90]"
            in (target / "flags.make").read_text()
        )
    assert any(word.endswith("libpython3.12.so") for word in lines["unpatched"])
    assert not any("libpython" in word for word in lines["patched"])
    assert any(word.endswith("libtorch_python.so") for word in lines["patched"])
