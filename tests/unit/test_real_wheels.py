"""The GPU libraries built here, run on the CPU through their own Python (when cached).

``launchers/kernel_build.sh`` builds a library's wheel for the GPU image and caches it; these
tests hand it, in the build toolchain's Python, to the checks in ``tests/realwheel/`` — the
library's own Python and real operators over the CPU emulation of its kernels (FA3:
``tests/realwheel/check_fa3_cpu.py``). Without a cached wheel each test skips with the one line
that names the build command: CI never builds (30 minutes), so there the recorded interface
(``tests/unit/test_real_schemas.py``) is what holds lcab to the real library.
"""

from __future__ import annotations

import pytest

from tests.helpers import real_schemas, real_wheels

CHECKS = {
    "fa3": "tests/realwheel/check_fa3_cpu.py",
    "flashmask": "tests/realwheel/check_flashmask_cpu.py",
    "ffa": "tests/realwheel/check_ffa_cpu.py",
    "bsa": "tests/realwheel/check_bsa_cpu.py",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_built_library_runs_its_own_python_on_the_cpu(name: str) -> None:
    commit = real_schemas.load(name)["provenance"]["commit"]
    build = real_wheels.cached(name, commit)
    if build is None:
        pytest.skip(real_wheels.missing(name))
    done = real_wheels.run_checks(build, CHECKS[name], "-rs")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
