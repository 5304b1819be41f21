"""Numerics against the fp64 reference: which tensors, how normalised, which tolerance.

Errors are normalised by the reference's largest magnitude, so one tolerance per dtype fits out,
lse and gradients alike. Nothing global is built: the reference streams K/V from the seeded
source (`lcab.bench.inputs`) and only the checked rows travel to rank 0 (`Collector`). The
rules: ``lcab/bench/README.md``, "Measurement protocol".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol, TypeAlias

from lcab.bench.inputs import BLOCK_TOKENS, SeededInputs
from lcab.bench.job_memory import cgroup_room, host_available
from lcab.cell import dtype_name
from lcab.kernels import PreparedAttention, get_kernel
from lcab.kernels.reference import STREAM_CHUNK_BYTES, streamed_rows
from lcab.lazy import lazy_module
from lcab.masks import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

#: Normalised max-error tolerance per dtype, by name (`lcab.cell.DTYPE_NAMES`).
TOLERANCE = {
    "float64": 1e-8,
    "float32": 1e-3,
    "float16": 1e-2,
    "bfloat16": 5e-2,
}


def tolerance(dtype: torch.dtype | str, override: float | None = None) -> float:
    """The tolerance for ``dtype`` or its name (or ``override``)."""
    return float(override) if override is not None else TOLERANCE.get(dtype_name(dtype), 5e-2)


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


_FULL_OVERHEAD = 3
"""Score-sized fp64 blocks the full reference keeps (scores, probabilities, their gradient)."""


def reference_bytes(
    heads_q: int, heads_kv: int, head_dim: int, seqlen: int, rows: int | None
) -> int:
    """Bytes the checking rank needs for one check (full mode: ``rows`` None), fp64."""
    tokens = 4 * (heads_q + heads_kv) * head_dim  # q, dout, dq, out + k, v, dk, dv per token
    if rows is None:
        return seqlen * tokens * 8 * 2 + _FULL_OVERHEAD * heads_q * seqlen * seqlen * 8
    return rows * tokens * 8 * 2 + 2 * STREAM_CHUNK_BYTES


def memory_budget(device: torch.device) -> int:
    """Bytes a numerics check may take: 90 % of the free GPU memory, half the host's available.

    In a memory cgroup, half its room if less (sized by the host's memory, a check killed every
    frontier's timed run in a 0.75 GiB cgroup).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.9)
    room = cgroup_room()
    known = [b for b in (host_available(), room and room[0] - room[2]) if b is not None]
    return min(known) // 2 if known else 1 << 62  # no reading: do not refuse


class Reference:
    """The fp64 reference of one (seqlen, mask sample), computed on first use.

    Full up to ``bench.numerics_full_max``; above it the sampled rows' out, lse and dq in one
    pass over K/V chunks of whole seeded blocks, each drawn once.
    """

    def __init__(self, mask: AttnMask, source: SeededInputs, rows: torch.Tensor | None) -> None:
        self.mask, self.source, self.rows = mask, source, rows
        self.full = rows is None
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
        src = self.source
        if self.rows is None:
            leaves = [src.whole(n).double().requires_grad_(True) for n in ("q", "k", "v")]
            out, lse = get_kernel("reference")(leaves[0], leaves[1], leaves[2], self.mask)
            assert lse is not None
            grads = torch.autograd.grad(out, leaves, src.whole("dout").double())
            self._fwd = (out.detach(), lse.detach())
            self._grads = {"dq": grads[0], "dk": grads[1], "dv": grads[2]}
        else:
            out, lse, dq = streamed_rows(
                src.rows("q", self.rows),
                self.rows,
                self.mask,
                lambda a, b: (src.span("k", a, b), src.span("v", a, b)),
                src.problem.heads_kv,
                src.rows("dout", self.rows),
                align=BLOCK_TOKENS,  # key chunks of whole seeded blocks: each drawn once
            )
            self._fwd = (out, lse)
            self._grads = {"dq": dq, "dk": None, "dv": None}


class Collector(Protocol):
    """How a check brings chosen global rows of a result to the checking rank."""

    is_root: bool
    """Whether this rank checks (rank 0 under CP; the single device otherwise)."""

    def collect(self, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor | None:
        """Rows ``rows`` (sorted; None: all) of the global tensor of native ``x``, on the root."""

    def collect_lse(self, lse: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor | None:
        """Columns ``rows`` of the global (H, S) LSE of native ``lse``, on the root."""


class LocalCollector:
    """`Collector` of a single-device kernel: its whole output, the rows picked."""

    is_root = True

    def __init__(self, prepared: PreparedAttention) -> None:
        self.prepared = prepared

    def collect(self, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """The rows of the whole output."""
        whole = self.prepared.from_native(x)
        return whole if rows is None else whole[rows.to(whole.device)]

    def collect_lse(self, lse: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """The columns of the whole LSE."""
        whole = self.prepared.lse_from_native(lse)
        return whole if rows is None else whole[:, rows.to(whole.device)]


Results: TypeAlias = "dict[str, torch.Tensor | None]"


def run_check(
    pass_: str,
    prepared: PreparedAttention,
    native: dict[str, torch.Tensor],
    rows: torch.Tensor | None,
    collector: Collector,
) -> Results | None:
    """One untimed call of ``pass_`` and its results (rows ``rows``) on the checking rank.

    Every rank calls and collects (collective under CP); other ranks get None. A gradient the
    kernel did not produce is None; sampled mode leaves dk and dv out.
    """
    if pass_ == "fwd":
        with torch.no_grad():
            out, lse = prepared.run(native["q"], native["k"], native["v"])
        got: Results = {"out": collector.collect(out, rows)}
        if lse is not None:
            got["lse"] = collector.collect_lse(lse, rows)
        return got if collector.is_root else None
    leaves = [native[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v")]
    out, _ = prepared.run(*leaves)
    out.backward(native["dout"])
    del out
    got = {}
    for name, leaf in zip(("dq", "dk", "dv"), leaves, strict=True):
        if name != "dq" and rows is not None:
            continue
        got[name] = None if leaf.grad is None else collector.collect(leaf.grad, rows)
    return got if collector.is_root else None


def compare(results: Results, reference: Reference) -> dict[str, float]:
    """Normalised error of every result against the reference (a missing gradient: inf)."""
    errors: dict[str, float] = {}
    if "out" in results:
        ref_out, ref_lse = reference.forward()
        out = results["out"]
        errors["out"] = math.inf if out is None else normalised_error(out, ref_out)
        lse = results.get("lse")
        if lse is not None:
            errors["lse"] = lse_error(lse, ref_lse)
        return errors
    ref_grads = reference.grads()
    for name, grad in results.items():
        ref = ref_grads[name]
        if grad is None:
            errors[name] = math.inf
        elif ref is not None:
            errors[name] = normalised_error(grad, ref)
    return errors
