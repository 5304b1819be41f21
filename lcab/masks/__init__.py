"""The mask engine: every mask as slices, from which every kernel's form is derived.

Public API::

    from lcab.masks import make_mask, list_masks
    mask = make_mask("causal_document", 65536, seed=0)
    mask.area(), mask.to_dense(), mask.restrict((0, 1024), (0, 4096)), mask.slices, mask.doc_lengths
"""

from lcab.masks.core import AttnMask, RowIntervals
from lcab.masks.factory import get_pattern, list_masks, make_mask, make_params
from lcab.masks.geometry import SliceKind

__all__ = [
    "AttnMask",
    "RowIntervals",
    "SliceKind",
    "get_pattern",
    "list_masks",
    "make_mask",
    "make_params",
]
