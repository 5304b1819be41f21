"""`make_mask`: build any registered pattern by name, with checked parameters."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from lcab.masks.core import MAX_SEQLEN, AttnMask
from lcab.masks.patterns import MASK_PATTERNS, MaskPattern, PatternParams

_TYPE_CHECKS: dict[str, tuple[type, ...]] = {
    "int": (int, np.integer),
    "float": (int, float, np.integer, np.floating),
    "str": (str,),
    "bool": (bool,),
}


def _check_field_types(pattern: MaskPattern, params: PatternParams) -> None:
    """Reject values of the wrong type, e.g. window='wide' (dataclasses do not check types)."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        declared = str(f.type).replace(" ", "")
        optional = declared.endswith("|None")
        base = declared.removesuffix("|None")
        if value is None:
            if not optional:
                raise ValueError(f"mask {pattern.name!r}: {f.name} must not be None")
            continue
        if base.startswith("list["):
            ok = isinstance(value, (list, tuple, np.ndarray))
        else:
            accepted = _TYPE_CHECKS.get(base)
            ok = accepted is None or (
                isinstance(value, accepted) and not (base != "bool" and isinstance(value, bool))
            )
        if not ok:
            raise ValueError(
                f"mask {pattern.name!r}: {f.name}={value!r} has type {type(value).__name__}; "
                f"expected {base}"
            )


def list_masks() -> list[str]:
    """Names of every registered mask pattern (aliases excluded)."""
    return MASK_PATTERNS.names()


def get_pattern(name: str) -> MaskPattern:
    """The registered pattern ``name`` (or alias).

    Raises UnknownNameError: a ValueError listing the valid names.
    """
    return MASK_PATTERNS.get(name)


def make_params(name: str, seqlen: int, **params: Any) -> tuple[MaskPattern, PatternParams]:
    """Check ``params`` for pattern ``name`` at ``seqlen`` and return them as its dataclass."""
    pattern = get_pattern(name)
    if (
        not isinstance(seqlen, (int, np.integer))
        or isinstance(seqlen, bool)
        or not (0 < seqlen < MAX_SEQLEN)
    ):
        raise ValueError(f"seqlen={seqlen!r} is invalid: need an integer in [1, {MAX_SEQLEN})")
    valid = pattern.param_names()
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for mask {pattern.name!r}; "
            f"valid: {', '.join(valid) if valid else '(none)'}"
        )
    values = pattern.params_cls(**params)
    _check_field_types(pattern, values)
    values.check(int(seqlen))
    return pattern, values


def make_mask(name: str, seqlen: int, *, seed: int = 0, **params: Any) -> AttnMask:
    """Build mask pattern ``name`` over a packed sequence of ``seqlen`` tokens.

    The same (name, seqlen, params, seed) always gives the same mask. The returned mask records
    its name, every parameter (random ones resolved to the drawn value, so
    ``make_mask(m.name, S, seed=m.seed, **m.params) == m``), its seed and its documents.

    Raises ValueError: unknown name or parameter, or a parameter out of its range.
    """
    pattern, values = make_params(name, seqlen, **params)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative integer")
    rng = np.random.default_rng(int(seed))
    generated = pattern.generate(int(seqlen), rng, values)
    resolved = dataclasses.asdict(values) | generated.resolved
    return AttnMask(
        generated.slices,
        int(seqlen),
        head_ptr=generated.head_ptr,
        name=pattern.name,
        params=resolved,
        seed=int(seed),
        doc_lengths=generated.doc_lengths,
    )
