"""The forkserver preload list names modules that exist and hold the rank entry point.

CPython's forkserver silently skips a preload module that fails to import, so a renamed module
would only make every rank start slower; this test makes such a rename fail loudly.
"""

from __future__ import annotations

import subprocess
import sys

from lcab.bench.worker import PRELOAD, worker_main


def test_every_preloaded_module_imports_in_a_fresh_interpreter() -> None:
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    result = subprocess.run(
        [sys.executable, "-c", code, *PRELOAD], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_rank_entry_point_lives_in_a_preloaded_module() -> None:
    assert worker_main.__module__ in PRELOAD
    assert "torch" in PRELOAD
