"""Host staging: moving CUDA tensors through gloo, which reads and writes host memory.

Ranks that share one GPU cannot use NCCL, so a numerics-only run uses gloo with CUDA kernels.
gloo (torch 2.13) stages CUDA tensors itself for its collectives, but ``send`` and ``recv`` hand
the data pointer straight to a gloo buffer, so a CUDA tensor cannot travel point to point (the
cp guide cites the source).

Modes (one per process, set when the rank joins its world):
  * ``off``: nothing is staged (CPU ranks, or CUDA ranks on NCCL);
  * ``p2p``: point-to-point transfers go through host copies (gloo with CUDA tensors);
  * ``all``: every CP transfer goes through host copies — forced with the environment variable
    `STAGING_ENV` (``LCAB_CP_HOST_STAGING=all``), which also runs the whole staging path on CPU
    ranks, where the copies are real copies, for tests.

Staging changes where bytes wait, not how many travel: counts stay those of the logical tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


MODES = ("off", "p2p", "all")
STAGING_ENV = "LCAB_CP_HOST_STAGING"
"""Environment variable that forces a staging mode (off, p2p, all); unset or ``auto``: chosen."""

_MODE = ["off"]
_HOST = "cpu"
"""Where staged copies live (a device name: torch accepts it, and it needs no torch to define)."""
_COPIES = [0]  # host copies made by this process: tests check that staging really ran


def valid_modes(device: torch.device | str, backend: str) -> tuple[str, ...]:
    """The modes that can carry this rank's tensors over ``backend``.

    CUDA tensors over gloo need at least ``p2p``; NCCL reads device memory, so nothing staged;
    CPU tensors over gloo take any mode (``all`` runs the staging path for tests).
    """
    cuda = torch.device(device).type == "cuda"
    if backend == "nccl":
        return ("off",)
    return ("p2p", "all") if cuda else MODES


def choose_mode(device: torch.device | str, backend: str, env: Mapping[str, str]) -> str:
    """The staging mode of a rank on ``device`` talking over ``backend``.

    Raises:
        ValueError: the environment names an unknown mode, or one that cannot carry this
            rank's tensors (a send would go to the wrong device): one line, with the valid ones.

    """
    forced = env.get(STAGING_ENV, "auto").strip().lower() or "auto"
    if forced == "auto":
        return "p2p" if torch.device(device).type == "cuda" and backend == "gloo" else "off"
    if forced not in MODES:
        raise ValueError(f"{STAGING_ENV}={forced!r} is not a mode; valid: auto, {', '.join(MODES)}")
    valid = valid_modes(device, backend)
    if forced not in valid:
        where = f"{torch.device(device).type} tensors over {backend}"
        why = (
            "NCCL reads device memory, not host copies"
            if backend == "nccl"
            else "gloo's send/recv read host memory, not a GPU's"
        )
        raise ValueError(
            f"{STAGING_ENV}={forced!r} cannot carry {where} ({why}); valid here: auto, "
            f"{', '.join(valid)}"
        )
    return forced


def set_mode(mode: str) -> None:
    """Set this process's staging mode (`MODES`)."""
    if mode not in MODES:
        raise ValueError(f"staging mode {mode!r}; valid: {', '.join(MODES)}")
    _MODE[0] = mode


def configure(device: torch.device | str, backend: str) -> str:
    """Choose and set this process's mode from its device, backend and the environment."""
    mode = choose_mode(device, backend, os.environ)
    set_mode(mode)
    return mode


def mode() -> str:
    """The staging mode of this process."""
    return _MODE[0]


def stages_p2p() -> bool:
    """Whether point-to-point transfers go through host copies."""
    return _MODE[0] != "off"


def stages_collectives() -> bool:
    """Whether collectives go through host copies (gloo stages CUDA collectives itself)."""
    return _MODE[0] == "all"


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous host copy of ``t`` (a distinct buffer even when ``t`` is on the host)."""
    _COPIES[0] += 1
    return t.detach().to(_HOST, copy=True, memory_format=torch.contiguous_format)


def host_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous host buffer of ``t``'s shape and dtype."""
    return torch.empty(t.shape, dtype=t.dtype, device=_HOST)


def to_device(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A copy of the host buffer ``host`` on ``like``'s device (a new tensor)."""
    return host.to(like.device, copy=True)
