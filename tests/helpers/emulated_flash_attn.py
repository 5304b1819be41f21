"""flash-attn 2.8.3.post2's own Python, imported unchanged over an emulated extension.

The sdist on PyPI (cached by `tests.helpers.upstream_source`) carries ``flash_attn/__init__.py``
and ``flash_attn/flash_attn_interface.py`` — the files the wheel installs. ``__init__`` imports
only ``flash_attn_interface``, which imports torch and the compiled ``flash_attn_2_cuda``
(L15; the ROCm branch is off unless ``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE``). So the package
imports on a CPU machine as it is once that one module exists: the two files are written, byte
for byte as the sdist has them (checked on every load), into a folder of the cache that goes
first on ``sys.path``, and ``sys.modules["flash_attn_2_cuda"]`` is the emulation
(`tests.helpers.emulated_flash_attn_2_cuda`). Nothing else of the library is replaced.

On import the file registers its private calls as ``torch.library.custom_op``s
``flash_attn::_flash_attn_(varlen_)forward/backward`` with ``device_types="cuda"`` (L54-58: on
every torch >= 2.4), so called with CPU tensors they have no kernel. The loader registers each
op's own Python function (``CustomOpDef._init_fn``, the body the library wrote) for CPU with
``CustomOpDef.register_kernel`` — the function a GPU runs, dispatched from another device key.

`loaded` is a context manager for a test process: it sets aside any other ``flash_attn``
already imported (a stand-in), and afterwards removes the ops it registered (so another loader —
or the same one — can register them again); an import of the same file by someone else is
reused, only its extension swapped. `install` loads for good, for a CP rank's own process.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.helpers import emulated_flash_attn_2_cuda
from tests.helpers.upstream_source import CACHE, sdist_member

DISTRIBUTION, VERSION = "flash-attn", "2.8.3.post2"
FILES = ("flash_attn/__init__.py", "flash_attn/flash_attn_interface.py")
OPS = ("_flash_attn_forward", "_flash_attn_varlen_forward")
OPS += ("_flash_attn_backward", "_flash_attn_varlen_backward")
NAMESPACE = "flash_attn"


ROOT = CACHE / f"{DISTRIBUTION}-{VERSION}" / "python"
"""Where `source_tree` writes the files (a CP rank imports from here as the test left it)."""


def source_tree() -> Path | None:
    """A folder holding the sdist's two files unchanged (None: the sdist is unavailable)."""
    root = ROOT
    for member in FILES:
        text = sdist_member(DISTRIBUTION, VERSION, member)
        if text is None:
            return None
        path = root / member
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = path.with_suffix(f".{os.getpid()}.tmp")
            scratch.write_text(text)
            scratch.replace(path)  # atomic: ranks of a CP test may write it at once
    return root


def require_source_tree() -> Path:
    """`source_tree`, or a failure in CI (``CI`` set) and a skip with its reason elsewhere."""
    root = source_tree()
    if root is None:
        why = f"could not download the {DISTRIBUTION} {VERSION} sdist (pip download, no index?)"
        if os.environ.get("CI"):
            pytest.fail(f"CI {why}: launchers/setup.sh pre-fetches it into {CACHE}")
        pytest.skip(why)
    return root


def _extension() -> types.ModuleType:
    module = types.ModuleType("flash_attn_2_cuda")
    for name in ("fwd", "varlen_fwd", "bwd", "varlen_bwd"):
        setattr(module, name, getattr(emulated_flash_attn_2_cuda, name))
    return module


def _drop_ops() -> None:
    """Unregister the ``flash_attn::`` custom ops an import of the interface defined."""
    from torch._library import custom_ops

    for name in OPS:
        opdef = custom_ops.OPDEFS.pop(f"{NAMESPACE}::{name}", None)
        if opdef is not None:
            opdef._lib._destroy()
        namespace = getattr(torch.ops, NAMESPACE)
        if name in vars(namespace):  # the cached OpOverloadPacket would outlive the op
            delattr(namespace, name)


def _ours(name: str) -> bool:
    return name in ("flash_attn", "flash_attn_2_cuda") or name.startswith("flash_attn.")


def install(root: Path) -> types.ModuleType:
    """Import ``flash_attn`` from ``root`` over the emulation; its ``flash_attn_interface``.

    Any ``flash_attn`` already imported (a stand-in) and its ops are dropped first.
    """
    for name in [n for n in sys.modules if _ours(n)]:
        del sys.modules[name]
    _drop_ops()
    os.environ.pop("FLASH_ATTENTION_TRITON_AMD_ENABLE", None)
    sys.modules["flash_attn_2_cuda"] = _extension()
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        interface = importlib.import_module("flash_attn.flash_attn_interface")
    finally:
        sys.path.remove(str(root))
    assert Path(interface.__file__).resolve().is_relative_to(root.resolve()), interface.__file__
    for name in OPS:
        opdef = getattr(interface, name)
        opdef.register_kernel("cpu")(opdef._init_fn)
    return interface


def _imported_already(root: Path) -> types.ModuleType | None:
    """The sdist's own ``flash_attn_interface`` when something in this process imported it."""
    interface = sys.modules.get("flash_attn.flash_attn_interface")
    path = Path(getattr(interface, "__file__", None) or "/nonexistent")
    if interface is None or not path.is_file():
        return None  # none, or a stand-in module
    same = path.read_text() == (root / FILES[1]).read_text()
    return interface if same and hasattr(interface, "flash_attn_gpu") else None


@contextmanager
def loaded() -> Iterator[types.ModuleType]:
    """The real ``flash_attn.flash_attn_interface`` for the duration (see the module doc).

    When another test of this process has imported the same file already (with an emulation
    of its own, say), its ops stay as they are and only the extension its module calls —
    ``flash_attn_gpu`` — is this one for the duration: destroying ops another import defined
    would break that other test.
    """
    root = require_source_tree()
    existing = _imported_already(root)
    if existing is not None:
        original, extension = existing.flash_attn_gpu, sys.modules.get("flash_attn_2_cuda")
        existing.flash_attn_gpu = sys.modules["flash_attn_2_cuda"] = _extension()
        for name in OPS:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{NAMESPACE}::{name}", "CPU"):
                opdef = getattr(existing, name)
                opdef.register_kernel("cpu")(opdef._init_fn)
        try:
            yield existing
        finally:
            existing.flash_attn_gpu = original
            if extension is None:
                sys.modules.pop("flash_attn_2_cuda", None)
            else:
                sys.modules["flash_attn_2_cuda"] = extension
        return
    saved = {name: module for name, module in sys.modules.items() if _ours(name)}
    try:
        yield install(root)
    finally:
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        _drop_ops()
        sys.modules.update(saved)
