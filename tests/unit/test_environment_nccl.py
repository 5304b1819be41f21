"""Records name the NCCL the process loaded (``ncclGetVersion``) beside torch's build-time one.

torch's CUDA wheels load libnccl dynamically (from the ``nvidia-nccl-cu*`` wheel), so the two
can differ. No GPU here: a stub ``libnccl.so.2`` exporting ``ncclGetVersion`` is compiled and
loaded into a fresh interpreter, which then finds it the way a CUDA process finds the real
one (``/proc/self/maps``) and asks it for its version.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/maps").exists() or shutil.which("cc") is None,
    reason="needs /proc and a C compiler for the stub libnccl",
)

_STUB = """
int ncclGetVersion(int *version) { *version = %d; return 0; }
"""

_PROBE = """
import ctypes, sys
from lcab.bench.environment import environment, loaded_nccl_versions
print("before", loaded_nccl_versions())
for path in sys.argv[1:]:
    ctypes.CDLL(path)
print("after", loaded_nccl_versions(), environment("cpu")["nccl_version_loaded"])
"""


def _stub(folder: Path, code: int, name: str = "libnccl.so.2") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "stub.c"
    source.write_text(_STUB % code)
    lib = folder / name
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return lib


def _probe(*libs: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *map(str, libs)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_the_loaded_libnccl_is_asked_for_its_own_version(tmp_path: Path) -> None:
    lib = _stub(tmp_path / "a", 22703)  # NCCL_VERSION_CODE of 2.27.3 (major*10000 + ...)
    assert _probe(lib) == ["before", "None", "after", "2.27.3", "2.27.3"]


def test_an_old_version_code_and_two_loaded_copies_are_all_named(tmp_path: Path) -> None:
    old = _stub(tmp_path / "old", 2804)  # before 2.9: major*1000 + minor*100 + patch
    new = _stub(tmp_path / "new", 22105, name="libnccl.so.2.21.5")
    assert _probe(old, new) == ["before", "None", "after", "2.8.4,2.21.5", "2.8.4,2.21.5"]


def test_a_library_that_is_not_libnccl_is_not_asked(tmp_path: Path) -> None:
    plugin = _stub(tmp_path / "net", 22703, name="libnccl-net.so")  # a network plugin
    assert _probe(plugin) == ["before", "None", "after", "None", "None"]
