"""Mask pictures: a PNG of the attended fraction per pixel, documents outlined on the diagonal.

Large masks are drawn by block coverage (`block_table` on a grid of about ``pixels`` cells per
side), so a 1M-token mask costs the same as a small one and no dense mask is built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lcab.masks.core import AttnMask
from lcab.masks.lowering.blocks import block_table


def coverage_image(mask: AttnMask, pixels: int = 512, head: int = 0) -> tuple[np.ndarray, int, int]:
    """(image, cell_q, cell_k): attended fraction of each cell of a ~pixels x pixels grid."""
    cell_q = max(1, -(-mask.seqlen_q // pixels))
    cell_k = max(1, -(-mask.seqlen_k // pixels))
    table = block_table(mask.head(head) if mask.num_heads > 1 else mask, cell_q, cell_k)
    return table.coverage_grid()[0], cell_q, cell_k


def save_mask_picture(
    mask: AttnMask,
    path: str | Path,
    *,
    pixels: int = 512,
    head: int = 0,
    title: str | None = None,
) -> Path:
    """Write a PNG of ``mask`` (one head) to ``path`` and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    image, cell_q, cell_k = coverage_image(mask, pixels, head)
    fig, ax = plt.subplots(figsize=(6.4, 6.4 * mask.seqlen_q / mask.seqlen_k + 0.6), dpi=110)
    ax.imshow(
        image,
        cmap="Blues",
        vmin=0.0,
        vmax=1.0,
        interpolation="nearest",
        extent=(0, mask.seqlen_k, mask.seqlen_q, 0),
    )
    cu = mask.doc_boundaries
    if cu is not None and mask.seqlen_q == mask.seqlen_k:
        segments = []
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            segments.append([(s, s), (e, s), (e, e), (s, e), (s, s)])
        ax.add_collection(LineCollection(segments, colors="tab:orange", linewidths=0.6))
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(title if title is not None else mask.summary(), fontsize=8, wrap=True)
    cells = (
        f"{cell_q}x{cell_k} tokens per pixel" if cell_q > 1 or cell_k > 1 else "1 token per pixel"
    )
    ax.text(1.0, -0.08, cells, transform=ax.transAxes, ha="right", fontsize=7, color="gray")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
