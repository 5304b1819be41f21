"""FlashAttention 4 (``flash-attn-4``, CuTe DSL, module ``flash_attn.cute``), varlen lowering.

Written against the API of flash-attn-4 4.0.0b5 and later; its calls, LSE facts and window rule
are the rows of `lcab.kernels.upstream.fa4` (read in the 4.0.0b36 wheel's
``flash_attn/cute/interface.py``, held to the installed package by
``tests/unit/test_upstream_packages.py``) and **CPU contract-tested only**: the tests run this
adapter's whole path against a stand-in package built from those rows, never the real kernels,
which are JIT-compiled on their first call. The first GPU run must confirm it.

The call is FA2/FA3's (`lcab.kernels.flash_attn.PreparedFlash`): the mask is lowered once by
`lcab.masks.lowering.to_varlen` to the dense ``flash_attn_func`` on (1, S, H, D) views (one
sequence) or ``flash_attn_varlen_func`` with int32 ``cu_seqlens_q/k`` and ``max_seqlen_q/k``,
with ``causal`` and a bottom-right aligned ``window_size``. Two spellings differ from FA2/FA3:

* an unbounded window side is ``None``, not -1: FA4 reads ints literally, and only a pair of two
  negative ints counts as "no window" — (-1, 5) would be a window, not a causal band;
* the LSE is asked for with ``return_lse=True``; both functions always return ``(out, lse)``.

LSE: natural log, float32, (B, H, S) for the dense call and (H, total_q) for varlen (as FA2/FA3;
with ``qv``, which lcab never passes, it would be heads-last). Empty rows are set from the mask
(out 0, lse -inf) whatever the library writes. Unlike FA2/FA3 the LSE is **differentiable**
(``dlse`` reaches the backward kernel when ``return_lse=True``, since 4.0.0b5), so the base
class's backward from merged softmax statistics works (``stats_backward=True``) — except on
sm100/sm110 at head dim 256, whose dedicated backward refuses ``dlse`` (an assertion, not a
reason: unconfirmed, and only ring-style CP would reach it).

Architectures (source): forward sm80, sm90, sm100/110, sm120; backward sm90 and later only.
Head dims 8..256 in multiples of 8 on sm90; on sm100/sm110 8..128 or exactly 256.

Installing and probing: ``pip install "lcab[fa4]"`` (pure-Python wheel plus
nvidia-cutlass-dsl). The version comes from the distribution ``flash-attn-4``
(``flash_attn.cute.__version__`` reads a distribution named ``fa4`` and says 0.0.0, which the
probe takes as unknown); every release so far is a 4.0.0 beta, so the minimum is the beta
4.0.0b5, compared as a pre-release. The wheel ships only ``flash_attn/cute``; when FA2
(``flash-attn``) is installed too, importing ``flash_attn.cute`` first runs FA2's
``flash_attn/__init__.py``, which imports ``flash_attn_2_cuda`` — a broken FA2 build then breaks
FA4's import. The probe looks the package up without importing its parent
(`lcab.kernels.packages.importable`), and a failing import (checked only where the cell would
run) is a reason naming the FA2 co-install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from lcab.kernels import packages
from lcab.kernels.base import Kernel, PreparedAttention, Problem, cuda_adapter_caps
from lcab.kernels.flash_attn import VARLEN_KWARGS, PreparedFlash
from lcab.kernels.packages import ApiNeed, PackageProbe
from lcab.kernels.registry import register_kernel
from lcab.kernels.upstream import fa4 as upstream
from lcab.lazy import lazy_module
from lcab.masks.core import AttnMask

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

#: Keywords the adapter passes to both calls.
CALL_KWARGS = ("softmax_scale", "causal", "window_size", "return_lse")
#: Compute capability majors flash-attn-4 dispatches to (its forward asserts the same).
FORWARD_MAJORS = (8, 9, 10, 11, 12)


class PreparedFA4(PreparedFlash):
    """FA2/FA3's lowered call with FA4's spellings: ``return_lse``, ``None`` = unbounded."""

    lse_kwargs: ClassVar[dict[str, Any]] = {"return_lse": True}
    #: flash-attn-4 >= 4.0.0b5 passes the LSE's gradient (dlse) to its backward
    lse_grad = upstream.LSE.differentiable
    library = "FlashAttention 4"
    follows = "flash-attn-4 4.0.0b5+"

    @staticmethod
    def window(left: int, right: int) -> tuple[int | None, int | None]:
        """-1 (the lowering's unbounded side) becomes None, FA4's only unbounded spelling."""
        return (None if left < 0 else left), (None if right < 0 else right)


@register_kernel
class FA4Kernel(Kernel):
    """FlashAttention 4 (``flash_attn.cute``), dense or varlen call (CPU contract-tested)."""

    name = "fa4"
    summary = "FlashAttention 4 (flash-attn-4, CuTe DSL), varlen + window"
    colour = "#ad494a"
    gpu_compared = True
    caps = cuda_adapter_caps(
        "varlen",
        # backward on sm90+ only: see extra_reasons
        max_head_dim=256,
        requires=PackageProbe(
            module=upstream.MODULE,
            distributions=(upstream.DISTRIBUTION,),
            install='pip install "lcab[fa4]"',
            note="pure wheel + cutlass-dsl (~100 MB), no compilation",
            needs=(
                ApiNeed(upstream.FLASH_ATTN_FUNC.name, CALL_KWARGS, positional=3),
                ApiNeed(
                    upstream.FLASH_ATTN_VARLEN_FUNC.name,
                    (*VARLEN_KWARGS, *CALL_KWARGS),
                    positional=3,
                ),
            ),
            min_version="4.0.0b5",
            requirement="flash-attn-4 >= 4.0.0b5, the first release whose backward takes the "
            "gradient of the LSE",
        ),
        min_compute_capability=(8, 0),
        stats_backward=True,  # differentiable LSE; tested against the reference with a stand-in
    )

    @override
    def package_reasons(self, device: torch.device | str) -> list[str]:
        """The probe's reasons; a failing import names an installed FA2, which runs first."""
        reasons = super().package_reasons(device)
        fa2 = packages.distribution_version(("flash-attn", "flash_attn"))
        if fa2 is None:
            return reasons
        hint = (
            f"; flash-attn {fa2} (FA2) is installed too and its flash_attn/__init__.py runs "
            "first: repair or uninstall it"
        )
        return [r + hint if "fails to import" in r else r for r in reasons]

    @override
    def extra_reasons(self, problem: Problem, pass_: str) -> list[str]:
        d = problem.head_dim
        reasons = (
            [f"FA4 takes head dims 8..256 in multiples of 8, not {d}"] if d < 8 or d % 8 else []
        )
        if problem.device_type != "cuda" or not packages.cuda_present():
            return reasons
        major, minor = torch.cuda.get_device_capability(problem.device)
        sm = f"sm_{major}{minor}"
        if major not in FORWARD_MAJORS:
            reasons.append(f"flash-attn-4 has kernels for compute capability 8.x-12.x, not {sm}")
        if pass_ in ("bwd", "fwd_bwd") and major < 9:
            reasons.append(f"FA4's backward needs sm90 or later (this GPU is {sm})")
        if major in (10, 11) and 128 < d < 256:
            reasons.append(f"FA4 on {sm} takes head dims 8..128 or 256, not {d}")
        return reasons

    @override
    def prepare(self, mask: AttnMask, problem: Problem) -> PreparedAttention:
        module = importlib.import_module(self.module)  # lazily: CUDA-only package
        dense = getattr(module, upstream.FLASH_ATTN_FUNC.name)
        varlen = getattr(module, upstream.FLASH_ATTN_VARLEN_FUNC.name)
        return PreparedFA4(mask, problem, dense, varlen)
