"""An emulated ``libnvidia-ml.so.1``, built at test time, for NVIDIA's real ``pynvml``.

lcab reads GPU telemetry (clocks, power, energy, temperature, clock event reasons) through
``pynvml`` (PyPI ``nvidia-ml-py``), NVIDIA's pure-Python binding: it ``ctypes``-loads the
driver's ``libnvidia-ml.so.1`` and resolves each function by name. A CPU machine has no such
library, and a stand-in ``pynvml`` module would test our idea of the binding rather than the
binding. So ``emulated_nvml.c`` (next to this file) is compiled into a library of that name,
and a process started with `nvml_env` finds it first through ``LD_LIBRARY_PATH``: the real
binding's calls, structures and error codes then run unchanged. The C file's header lists each
exported symbol with the pynvml function (nvidia-ml-py 13.615.71) it serves, and the emulated
machine's figures.

glibc reads ``LD_LIBRARY_PATH`` once, at process start, so the library is for *subprocesses*
(`run_with_nvml`, or ``subprocess`` with ``env=nvml_env(...)``); loading it into the test
process itself would not find it by name.

Settings (keyword arguments of `nvml_env`, read by the library at ``nvmlInit``; a malformed
value makes ``nvmlInit`` raise ``pynvml.NVMLError_InvalidArgument``):

* ``sm_mhz`` → ``LCAB_EMULATED_NVML_SM_MHZ``: every device's current SM clock is that fixed
  value (max SM clock stays 1980 MHz), to plant a clock and check share-of-peak scaling;
* ``name0`` → ``LCAB_EMULATED_NVML_NAME0``: device 0's name (at most 95 bytes);
* ``init="driver_not_loaded"`` → ``LCAB_EMULATED_NVML_INIT``: ``nvmlInit`` fails with
  ``NVML_ERROR_DRIVER_NOT_LOADED`` (``pynvml.NVMLError_DriverNotLoaded``), a node without a
  GPU driver;
* ``hang_after=n`` → ``LCAB_EMULATED_NVML_HANG_AFTER``: after ``n`` successful
  ``nvmlDeviceGetPowerUsage`` calls every further call blocks forever, a hung driver call;
* ``energy_period_ms=n`` → ``LCAB_EMULATED_NVML_ENERGY_PERIOD_MS``: the energy counter moves
  in steps of ``n`` ms (default 100, as the real driver's does about every 100 ms; 0: on every
  read);
* ``sample_period_ms=n`` → ``LCAB_EMULATED_NVML_SAMPLE_PERIOD_MS``: the driver sample buffer's
  period (default 10 ms);
* ``power_limit_w=n`` → ``LCAB_EMULATED_NVML_POWER_LIMIT_W``: the enforced power limit
  (default 700 W).

`emulated_nvml_dir` is a session fixture (build once per session, or per xdist worker); a test
module takes it with ``emulated_nvml_dir = emulated_nvml.emulated_nvml_dir`` (an alias, so
ruff sees no unused import) or ``tests/conftest.py`` may import it for every module.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("emulated_nvml.c")
LIBRARY = "libnvidia-ml.so.1"
COMPILE = ("-shared", "-fPIC", "-O1")

SETTINGS_PREFIX = "LCAB_EMULATED_NVML_"


class CompilerMissingError(RuntimeError):
    """No C compiler (``cc``) on ``PATH``: the library cannot be built here."""


def build_emulated_nvml(directory: Path) -> Path:
    """``directory`` holding ``libnvidia-ml.so.1`` compiled from `SOURCE` (cached by its hash).

    Raises `CompilerMissingError` without ``cc`` and ``RuntimeError`` (with the compiler's
    output) when compiling fails. Safe for several processes building into one folder at once:
    each compiles to a scratch name and renames it into place.
    """
    compiler = shutil.which("cc")
    if compiler is None:
        raise CompilerMissingError("no C compiler 'cc' on PATH to build the emulated NVML")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(COMPILE).encode()).hexdigest()
    directory.mkdir(parents=True, exist_ok=True)
    library, stamp = directory / LIBRARY, directory / f"{LIBRARY}.sha256"
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return directory
    scratch = directory / f".{LIBRARY}.{os.getpid()}.tmp"
    done = subprocess.run(
        [compiler, *COMPILE, "-o", str(scratch), str(SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        scratch.unlink(missing_ok=True)
        raise RuntimeError(f"cc failed to build the emulated NVML:\n{done.stderr}")
    scratch.replace(library)
    stamp_scratch = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    stamp_scratch.write_text(digest)
    stamp_scratch.replace(stamp)
    return directory


def nvml_env(directory: Path, **settings: int | str | None) -> dict[str, str]:
    """A copy of ``os.environ`` whose processes load the library in ``directory``.

    ``LD_LIBRARY_PATH`` starts with ``directory``; any ``LCAB_EMULATED_NVML_*`` inherited from
    this process is dropped and the given settings (module docstring: ``sm_mhz=1410`` sets
    ``LCAB_EMULATED_NVML_SM_MHZ``; None leaves one unset) are set.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(SETTINGS_PREFIX)}
    inherited = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(directory), *([inherited] if inherited else [])])
    for name, value in settings.items():
        if value is not None:
            env[f"{SETTINGS_PREFIX}{name.upper()}"] = str(value)
    return env


def run_with_nvml(
    directory: Path, code: str, *, timeout: float = 30.0, **settings: int | str | None
) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a new process with `nvml_env` (stdout and stderr captured)."""
    env = nvml_env(directory, **settings)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def expected_sm_mhz(t_ms: float) -> int:
    """The emulated SM clock ``t_ms`` after ``nvmlInit``, from the brief (not the C file):
    1980 MHz for 40 ms, then 1755 and 1830 MHz in turns of 20 ms."""
    if t_ms < 40:
        return 1980
    return 1755 if int((t_ms - 40) // 20) % 2 == 0 else 1830


def require_emulated_nvml(directory: Path) -> Path:
    """`build_emulated_nvml`, or a skip of the test when this machine has no ``cc``."""
    try:
        return build_emulated_nvml(directory)
    except CompilerMissingError as missing:
        pytest.skip(f"{missing} (install a C compiler, e.g. gcc)")


@pytest.fixture(scope="session")
def emulated_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the emulated ``libnvidia-ml.so.1`` (built once; skip without ``cc``)."""
    return require_emulated_nvml(tmp_path_factory.getbasetemp() / "emulated_nvml")
