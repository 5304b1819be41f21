"""`run_if`: one skip marker for tests that need hardware or optional packages.

It names every missing requirement in the skip reason, so a skipped GPU test says what the
machine lacks (a CUDA GPU, a package) instead of a bare "skipped".
"""

from __future__ import annotations

import importlib.util

import pytest
import torch


def run_if(
    *, cuda: bool = False, min_gpus: int = 0, packages: tuple[str, ...] = ()
) -> pytest.MarkDecorator:
    """A ``skipif`` marker whose reason lists what is missing (empty: the test runs)."""
    missing = []
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if (cuda or min_gpus) and gpus == 0:
        missing.append("a CUDA GPU")
    elif gpus < min_gpus:
        missing.append(f"{min_gpus} CUDA GPUs (found {gpus})")
    missing += [f"package {name!r}" for name in packages if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason="needs " + ", ".join(missing))
