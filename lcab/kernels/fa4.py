"""FlashAttention 4 (``flash-attn-4``, CuTe DSL, module ``flash_attn.cute``), varlen lowering.

CPU contract-tested only; calls, LSE facts and window rule are the rows of
`lcab.kernels.upstream.fa4`. The call is FA2/FA3's (`PreparedFlash`) but an unbounded window
side is ``None`` and the LSE is asked for with ``return_lse=True``. Its LSE is differentiable, so
the generic backward from merged statistics works. Forward on sm80-sm120, backward sm90+; head
dims 8..256 in multiples of 8 on sm90, 8..128 or 256 on sm100/110. The version comes from the
distribution ``flash-attn-4`` (``flash_attn.cute.__version__`` says 0.0.0); importing
``flash_attn.cute`` runs FA2's ``flash_attn/__init__.py`` when FA2 is installed too, so a broken
FA2 build is a reason naming the co-install.
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
VARLEN_CALL_KWARGS = (*VARLEN_KWARGS, *CALL_KWARGS)
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
                ApiNeed(upstream.FLASH_ATTN_VARLEN_FUNC.name, VARLEN_CALL_KWARGS, positional=3),
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
