"""Shared test settings: one torch thread per pytest-xdist worker (CI has 2 cores)."""

from __future__ import annotations

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
