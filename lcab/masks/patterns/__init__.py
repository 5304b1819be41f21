"""Every registered mask pattern (importing this package registers them)."""

from lcab.masks.patterns import basic, documents, prefix_lm, sparse, windows  # noqa: F401
from lcab.masks.patterns.base import MASK_PATTERNS, MaskPattern, PatternParams

__all__ = ["MASK_PATTERNS", "MaskPattern", "PatternParams"]
