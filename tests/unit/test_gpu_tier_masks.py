"""The GPU tier's masks build on any machine: a case that cannot even make its mask verifies
nothing, and the first GPU run found one (block_causal_document's block size did not divide S)."""

from __future__ import annotations

import pytest

from lcab.masks import list_masks
from tests.gpu.test_gpu_kernels import TILE, S, _mask


@pytest.mark.parametrize("kernel", ["", *TILE])
@pytest.mark.parametrize("name", list_masks())
def test_every_gpu_tier_mask_builds_at_the_tier_length(name, kernel):
    mask = _mask(name, heads_kv=2, kernel=kernel)
    assert (mask.seqlen_q, mask.seqlen_k) == (S, S)
    assert mask.to_dense().any()  # a mask attending nothing would verify nothing
