"""What the checks of a built library on the CPU share: masks, the fp64 reference, the checks.

Each check (``check_<library>_cpu.py``) loads its library from the wheel with the emulation of
its CUDA kernels registered on the real operators (`tests.helpers.real_wheels`), then runs
lcab's adapter through the library's own Python against lcab's fp64 ``reference`` kernel:
forward and autograd for every mask the adapter accepts, and the backward from merged
statistics block by block, as a ring calls it.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from lcab.kernels import Problem, get_kernel
from lcab.masks import AttnMask, make_mask
from tests.helpers import real_schemas, real_wheels
from tests.helpers.contract import tensors

TOL = 1e-10
CUTS = ((0, 48), (0, 24, 48), (0, 7, 30, 48))
"""Key blocks of a 48-token mask: one, two (halves) and three uneven ones."""
RING_MASKS = ("causal", "causal_document", "sliding_window")


def mask_of(name: str) -> AttnMask:
    """A 48-token mask of every pattern (block sizes that divide it; documents of 3-20)."""
    options: dict[str, dict[str, Any]] = {
        "block_causal_document": {"block_size": 8},
        "global_sliding_window": {"global_tokens": 4, "window": 6},
        "sliding_window": {"window": 5},
        "causal_document": {
            "seed": 3,
            "doc_source": "uniform",
            "min_doc_len": 3,
            "max_doc_len": 20,
        },
    }
    return make_mask(name, 48, **options.get(name, {}))


def reference(mask: AttnMask, q, k, v, dout):
    """The fp64 reference's out, LSE and autograd gradients."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = get_kernel("reference")(*leaves, mask)
    out.backward(dout)
    return out.detach(), lse.detach(), [leaf.grad for leaf in leaves]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max error over the finite entries, relative to the largest; empty rows must agree."""
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), "empty rows differ"
    scale = float(want[finite].abs().max()) or 1.0
    return float((got[finite] - want[finite]).abs().max()) / scale


def without_cpu(entries: dict[str, Any]) -> dict[str, Any]:
    """Recorded entries less the CPU kernels this process registered (the record has none)."""
    return {
        name: {**entry, "kernels": [k for k in entry.get("kernels", []) if k != "CPU"]}
        for name, entry in entries.items()
    }


def assert_record_is_live(name: str) -> None:
    """``tests/unit/data/real_schemas/NAME.json`` is what the loaded wheel defines."""
    site = Path(os.environ[real_wheels.SITE_ENV])
    live = real_schemas.record(name, site, site.parent / "build.json")
    committed = real_schemas.load(name)
    assert without_cpu(live["operators"]) == without_cpu(committed["operators"])
    assert without_cpu(live["callables"]) == without_cpu(committed["callables"])
    for key in ("commit", "submodules", "flags"):
        assert live["provenance"][key] == committed["provenance"][key]


def forward_and_autograd(
    kernel: str, mask_name: str, tol: float = TOL, mask: AttnMask | None = None
) -> None:
    """The adapter's forward (out, LSE) and autograd gradients equal the reference's (within
    ``tol``: a library whose buffers are float32 rounds there). ``mask``: another than the
    48-token one of ``mask_name``."""
    mask = mask if mask is not None else mask_of(mask_name)
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    refused = get_kernel(kernel).mask_refusals(Problem.of(q, k), mask)
    if refused:  # refused before any call, as in a sweep (its mask checks beyond the lowering)
        pytest.skip(f"{kernel} refuses {mask_name}: {refused[0]}")
    want_out, want_lse, want_grads = reference(mask, q, k, v, dout)
    prepared = get_kernel(kernel).prepare(mask, Problem.of(q, k))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = prepared.run(*leaves)
    assert relative(out.detach(), want_out) <= tol
    assert lse is not None and relative(lse.detach(), want_lse) <= tol
    out.backward(dout)
    for name, leaf, want in zip(("dq", "dk", "dv"), leaves, want_grads, strict=True):
        assert relative(leaf.grad, want) <= tol, name


def merged_backward(
    kernel: str,
    mask_name: str,
    cuts: tuple[int, ...],
    tol: float = TOL,
    mask: AttnMask | None = None,
) -> None:
    """Per key block with the whole row's (out, LSE), dq summed, dk/dv side by side: what a
    ring assembles, equal to the reference's gradients. ``mask``: as `forward_and_autograd`."""
    mask = mask if mask is not None else mask_of(mask_name)
    q, k, v, dout = tensors(mask, 4, 2, torch.float64, head_dim=16)
    out, lse, want = reference(mask, q, k, v, dout)
    dq, dks, dvs = torch.zeros_like(q), [], []
    for k0, k1 in itertools.pairwise(cuts):
        block = mask.restrict((0, mask.seqlen_q), (k0, k1))
        refused = get_kernel(kernel).mask_refusals(Problem.of(q, k[k0:k1]), block)
        if refused:  # a ring never sends it to the library either (lcab refuses the cell)
            pytest.skip(f"{kernel} refuses keys {k0}:{k1} of {mask_name}: {refused[0]}")
        prepared = get_kernel(kernel).prepare(block, Problem.of(q, k[k0:k1]))
        prepared.run(q, k[k0:k1], v[k0:k1])
        gq, gk, gv = prepared.backward(dout, q, k[k0:k1], v[k0:k1], out, lse)
        dq += gq
        dks.append(gk)
        dvs.append(gv)
    for name, g, w in zip(
        ("dq", "dk", "dv"), (dq, torch.cat(dks), torch.cat(dvs)), want, strict=True
    ):
        assert relative(g, w) <= tol, name
