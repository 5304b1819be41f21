"""The FLOP convention of lcab, in one place (the masks guide states it too).

    forward  = 4 · area · Hq · D     (two matmuls, QKᵀ and PV, at 2 FLOPs per multiply-add)
    backward = 2.5 × forward         (2 for the gradient matmuls + 0.5 for recomputing P)
    fwd+bwd  = 3.5 × forward

``area`` is the exact number of attended pairs (*useful* throughput: masked-out work and CP
padding are not credited); only query heads count; per-KV-head masks use the mean area. This is
the convention of LongCA-bench and FlashAttention.
"""

from __future__ import annotations

from typing import Literal, Protocol

Pass = Literal["fwd", "bwd", "fwd_bwd"]
"""A timed pass: forward, backward (forward outside the timer), or both."""

PASSES: tuple[Pass, ...] = ("fwd", "bwd", "fwd_bwd")
"""Every pass name, in display order: the one definition configs, kernels and records use."""


class MaskArea(Protocol):
    """What FLOP counting needs of a mask: its head count and exact attended area.

    A protocol rather than `lcab.masks.AttnMask` itself keeps this module at the bottom of the
    package (masks print their FLOPs; FLOPs never import masks).
    """

    @property
    def num_heads(self) -> int:
        """Mask heads (1, or one per KV head)."""

    def area(self) -> int:
        """Attended (q, k) pairs, averaged over mask heads as the FLOP convention says."""


def as_pass(name: str) -> Pass:
    """``name`` as a `Pass`, or ValueError naming the valid passes."""
    if name not in PASSES:
        raise ValueError(f"pass {name!r} is unknown; valid: {', '.join(PASSES)}")
    return name


#: Name stored in every record next to FLOP figures.
FLOP_CONVENTION = "lcab/1: fwd=4*area*Hq*D, bwd=2.5*fwd, fwd_bwd=3.5*fwd; area=attended pairs"

#: Multiples of the forward count, as exact fractions (numerator, denominator).
PASS_FACTORS: dict[Pass, tuple[int, int]] = {"fwd": (2, 2), "bwd": (5, 2), "fwd_bwd": (7, 2)}


def _scaled(forward: int, pass_: str) -> int:
    num, den = PASS_FACTORS[as_pass(pass_)]
    return forward * num // den  # forward is a multiple of 4, so this is exact


def _check_heads(heads_q: int, head_dim: int) -> None:
    if heads_q < 1 or head_dim < 1:
        raise ValueError(f"heads_q={heads_q} and head_dim={head_dim} must be >= 1")


def attention_flops(mask: MaskArea, heads_q: int, head_dim: int, pass_: Pass = "fwd") -> int:
    """Useful FLOPs of attention over ``mask`` (exact integer).

    Raises ValueError: ``heads_q`` is not a multiple of the mask's head count, or a bad pass name.
    """
    _check_heads(heads_q, head_dim)
    if heads_q % mask.num_heads:
        raise ValueError(
            f"heads_q={heads_q} must be a multiple of the mask's {mask.num_heads} heads "
            f"(one mask per KV head)"
        )
    forward = 4 * mask.area() * (heads_q // mask.num_heads) * head_dim
    return _scaled(forward, pass_)


def dense_flops(
    seqlen_q: int, seqlen_k: int, heads_q: int, head_dim: int, pass_: Pass = "fwd"
) -> int:
    """FLOPs of the same attention without a mask (area = Sq · Sk): the dense-equivalent figure."""
    _check_heads(heads_q, head_dim)
    return _scaled(4 * seqlen_q * seqlen_k * heads_q * head_dim, pass_)


def tflops_per_s(flops: int, seconds: float) -> float:
    """Throughput in TFLOP/s; 0.0 when the time is not positive."""
    return flops / seconds / 1e12 if seconds > 0 else 0.0
