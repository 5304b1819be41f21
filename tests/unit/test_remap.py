"""remap: the mask between two token layouts equals the dense mask gathered by those layouts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.masks import AttnMask, list_masks, make_mask
from lcab.masks.remap import remap, select_heads

S = 60


@st.composite
def layouts(draw):
    kind = draw(st.sampled_from(["range", "perm", "zigzag"]))
    if kind == "range":
        a = draw(st.integers(0, S - 1))
        b = draw(st.integers(a + 1, S))
        tokens = list(range(a, b))
    elif kind == "perm":
        tokens = draw(st.permutations(range(S)))[: draw(st.integers(1, S))]
    else:
        parts = draw(st.integers(1, 4))
        r = draw(st.integers(0, parts - 1))
        chunks = np.array_split(np.arange(S), 2 * parts)
        tokens = [*chunks[r].tolist(), *chunks[2 * parts - 1 - r].tolist()]
    for _ in range(draw(st.integers(0, 3))):
        tokens.insert(draw(st.integers(0, len(tokens))), -1)
    return np.array(tokens or [-1])


def gathered(dense: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    out = np.zeros((dense.shape[0], len(rows), len(cols)), dtype=bool)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            if r >= 0 and c >= 0:
                out[:, i, j] = dense[:, r, c]
    return out


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(list_masks()), rows=layouts(), cols=layouts(), seed=st.integers(0, 9))
def test_remap_equals_gathered_dense(name, rows, cols, seed):
    params = {"doc_source": "uniform", "min_doc_len": 2, "max_doc_len": 25}
    from lcab.masks import get_pattern

    names = get_pattern(name).param_names()
    kw = {k: v for k, v in params.items() if k in names}
    kw |= {"window": 7} if "window" in names else {}
    kw |= {"block_size": 4} if "block_size" in names else {}
    kw |= {"heads": 2} if "heads" in names else {}
    kw |= {"avg_block_size": 12, "min_block_size": 4} if "avg_block_size" in names else {}
    kw |= {"global_tokens": 5} if "global_tokens" in names else {}
    mask = make_mask(name, S, seed=seed, **kw)
    dense = mask.to_dense().numpy()
    dense = dense[None] if dense.ndim == 2 else dense
    sub = remap(mask, rows, cols)
    got = sub.to_dense().numpy()
    got = got[None] if got.ndim == 2 else got
    assert np.array_equal(got, gathered(dense, rows, cols))
    assert sub.area() == got.sum()
    AttnMask(sub.slices, sub.seqlen_q, sub.seqlen_k, head_ptr=sub.head_ptr)  # valid, disjoint


def test_select_heads_picks_mask_heads_in_order():
    mask = make_mask("block_sparse", 64, heads=3, block_size=8)
    picked = select_heads(mask, [2, 0])
    dense = mask.to_dense().numpy()
    assert np.array_equal(picked.to_dense().numpy(), dense[[2, 0]])
