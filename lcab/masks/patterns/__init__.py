"""Every registered mask pattern.

Each module of this package is imported, so a pattern registers by existing: a new mask is one
module (its checklist: lcab/masks/README.md "Adding a mask").
"""

import importlib
import pkgutil

from lcab.masks.patterns.base import MASK_PATTERNS, MaskPattern, PatternParams

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["MASK_PATTERNS", "MaskPattern", "PatternParams"]
