"""Numerics against the fp64 reference: which tensors, how normalised, which tolerance.

Errors are normalised by the reference's largest magnitude (max |x - ref| / max |ref|), so one
tolerance per dtype fits out, lse and gradients alike. NaN or a finite/-inf disagreement in the
LSE is an infinite error: it never passes. When the whole reference would not fit
(heads_q·Sq·Sk above ``numerics_full_max``), a sample of query rows is checked instead; the rows
check out, lse and dq exactly, while dk/dv (which sum over every row) are left unchecked.
"""

from __future__ import annotations

import math

import torch

from lcab.kernels import PreparedAttention, get_kernel
from lcab.kernels.reference import reference_rows, sample_rows
from lcab.masks import AttnMask

#: Normalised max-error tolerance per dtype.
TOLERANCE = {
    torch.float64: 1e-8,
    torch.float32: 1e-3,
    torch.float16: 1e-2,
    torch.bfloat16: 5e-2,
}


def tolerance(dtype: torch.dtype, override: float | None = None) -> float:
    """The tolerance for ``dtype`` (or ``override``)."""
    return float(override) if override is not None else TOLERANCE.get(dtype, 5e-2)


def normalised_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |x - ref| / max(max |ref|, 1e-12) in float64; inf on NaN or shape mismatch."""
    if x.shape != ref.shape:
        return math.inf
    x64, ref64 = x.detach().double(), ref.detach().double()
    if torch.isnan(x64).any():
        return math.inf
    scale = max(float(ref64.abs().max()) if ref64.numel() else 0.0, 1e-12)
    return float((x64 - ref64).abs().max()) / scale if ref64.numel() else 0.0


def lse_error(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Error of a log-sum-exp: -inf exactly where the reference is -inf, else as above."""
    lse64, ref64 = lse.detach().double(), ref.detach().double()
    if lse64.shape != ref64.shape or torch.isnan(lse64).any():
        return math.inf
    ref_empty = torch.isinf(ref64)
    if not torch.equal(torch.isinf(lse64), ref_empty):
        return math.inf
    keep = ~ref_empty
    if not keep.any():
        return 0.0
    scale = max(float(ref64[keep].abs().max()), 1.0)
    return float((lse64[keep] - ref64[keep]).abs().max()) / scale


class Reference:
    """The fp64 reference of one (seqlen, mask sample), computed on first use.

    Full (out, lse and every gradient) up to ``bench.numerics_full_max``; above it, the exact
    rows of a seeded sample of queries (out, lse, dq).
    """

    def __init__(
        self, mask: AttnMask, inputs: dict[str, torch.Tensor], full: bool, rows: int, seed: int
    ) -> None:
        self.mask, self.inputs, self.full = mask, inputs, full
        self.rows = None if full else sample_rows(mask.seqlen_q, rows, seed)
        self._fwd: tuple[torch.Tensor, torch.Tensor] | None = None
        self._grads: dict[str, torch.Tensor | None] | None = None

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference (out, lse): all rows, or the sampled ones."""
        if self._fwd is None:
            self._compute()
        assert self._fwd is not None
        return self._fwd

    def grads(self) -> dict[str, torch.Tensor | None]:
        """Reference dq, dk, dv (dk and dv are None in sampled mode)."""
        if self._grads is None:
            self._compute()
        assert self._grads is not None
        return self._grads

    def _compute(self) -> None:
        x = self.inputs
        if self.full:
            leaves = [x[n].detach().double().requires_grad_(True) for n in ("q", "k", "v")]
            out, lse = get_kernel("reference")(leaves[0], leaves[1], leaves[2], self.mask)
            assert lse is not None
            grads = torch.autograd.grad(out, leaves, x["dout"].double())
            self._fwd = (out.detach(), lse.detach())
            self._grads = {"dq": grads[0], "dk": grads[1], "dv": grads[2]}
        else:
            assert self.rows is not None
            out, lse, dq = reference_rows(
                x["q"], x["k"], x["v"], self.mask, self.rows, x["dout"][self.rows]
            )
            self._fwd = (out, lse)
            self._grads = {"dq": dq, "dk": None, "dv": None}


def check_pass(
    pass_: str,
    prepared: PreparedAttention,
    native: dict[str, torch.Tensor],
    reference: Reference | None,
) -> dict[str, float] | None:
    """Normalised errors of one untimed call of ``pass_`` against the reference.

    Every rank makes the call (under CP it is collective, and so is ``from_native``); only the
    rank holding the reference compares, the others return None.
    """
    rows = reference.rows if reference is not None else None
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])
    if pass_ == "fwd":
        with torch.no_grad():
            out, lse = prepared.run(native["q"], native["k"], native["v"])
        out = prepared.from_native(out)
        lse = None if lse is None else prepared.lse_from_native(lse)
        if reference is None:
            return None
        ref_out, ref_lse = reference.forward()
        errors = {"out": normalised_error(pick(out), ref_out)}
        if lse is not None:
            lse_rows = lse if rows is None else lse[:, rows]
            errors["lse"] = lse_error(lse_rows, ref_lse)
        return errors
    leaves = [native[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v")]
    out, _ = prepared.run(*leaves)
    out.backward(native["dout"])
    grads = {
        name: None if leaf.grad is None else prepared.from_native(leaf.grad)
        for name, leaf in zip(("dq", "dk", "dv"), leaves, strict=True)
    }
    if reference is None:
        return None
    errors = {}
    for name, grad in grads.items():
        ref = reference.grads()[name]
        if grad is None:
            errors[name] = float("inf")
        elif ref is not None:
            errors[name] = normalised_error(pick(grad), ref)
    return errors
