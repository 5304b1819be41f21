"""Shared test settings and fixtures.

One torch thread per pytest-xdist worker (CI has 2 cores). ``compose`` composes the app's
config the way ``python -m lcab.main`` does (registered schemas, ``conf/``), so tests that need
a resolved cell or a config start from the real config tree rather than a hand-made dict.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from lcab.config import CONF_DIR, register_configs

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

Compose = Callable[..., DictConfig]


@pytest.fixture(scope="module")
def compose() -> Iterator[Compose]:
    """``compose(overrides, hydra=False)``: the composed config of ``python -m lcab.main``."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):

        def composed(overrides: list[str], hydra: bool = False) -> DictConfig:
            return hydra_compose("config", overrides=overrides, return_hydra_config=hydra)

        yield composed
    GlobalHydra.instance().clear()


def pytest_configure(config: pytest.Config) -> None:
    """Name this test session once (the controller's id; xdist workers inherit it)."""
    from tests.helpers.slurm import SESSION_ENV

    os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the slurm tier's test cluster once, in the controlling process, at the very end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        from tests.helpers.slurm import stop_test_cluster

        stop_test_cluster()
