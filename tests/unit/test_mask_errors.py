"""Bad input to `make_mask` and friends: ValueError whose message names the culprit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lcab.masks import get_pattern, list_masks, make_mask


def test_unknown_pattern_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="nonexistent_mask") as err:
        make_mask("nonexistent_mask", 128)
    for name in list_masks():
        assert name in str(err.value)
    with pytest.raises(ValueError, match="nonexistent_mask"):
        get_pattern("nonexistent_mask")


@pytest.mark.parametrize("name", list_masks())
def test_unknown_parameter_lists_valid_params(name: str) -> None:
    with pytest.raises(ValueError, match="bogus_param") as err:
        make_mask(name, 128, bogus_param=3)
    for param in get_pattern(name).param_names():
        assert param in str(err.value)


@pytest.mark.parametrize("name", list_masks())
@pytest.mark.parametrize("seqlen", [0, -1, -1024])
def test_nonpositive_seqlen(name: str, seqlen: int) -> None:
    with pytest.raises(ValueError, match="seqlen"):
        make_mask(name, seqlen)


@pytest.mark.parametrize("seqlen", [1.5, "128", None, True])
def test_non_integer_seqlen(seqlen: Any) -> None:
    with pytest.raises(ValueError, match="seqlen"):
        make_mask("causal", seqlen)


@pytest.mark.parametrize(
    ("name", "seqlen", "params", "culprit"),
    [
        ("sliding_window", 128, {"window": -1}, "window"),
        ("sliding_window_causal", 128, {"window": -5}, "window"),
        ("global_sliding_window", 128, {"window": -1}, "window"),
        ("global_sliding_window", 128, {"global_tokens": 129}, "global_tokens"),
        ("global_sliding_window", 128, {"global_tokens": -1}, "global_tokens"),
        ("prefix_lm_causal", 128, {"prefix": 129}, "prefix"),
        ("prefix_lm_causal", 128, {"prefix": -1}, "prefix"),
        ("prefix_lm_document", 128, {"prefix": 129}, "prefix"),
        ("block_causal_document", 1000, {"block_size": 64}, "block_size"),
        ("block_causal_document", 1024, {"block_size": 0}, "block_size"),
        ("block_causal_document", 1024, {"block_size": 64, "min_blocks": 0}, "min_blocks"),
        (
            "block_causal_document",
            1024,
            {"block_size": 64, "min_blocks": 5, "max_blocks": 2},
            "max_blocks",
        ),
        ("block_sparse", 1024, {"density": 0}, "density"),
        ("block_sparse", 1024, {"density": 0.0}, "density"),
        ("block_sparse", 1024, {"density": 1.5}, "density"),
        ("block_sparse", 1024, {"density": -0.1}, "density"),
        ("block_sparse", 1024, {"block_size": 0}, "block_size"),
        ("block_sparse", 1024, {"heads": 0}, "heads"),
        ("varblock_sparse", 1024, {"density": 0}, "density"),
        ("varblock_sparse", 1024, {"density": 1.5}, "density"),
        ("varblock_sparse", 1024, {"density": -0.1}, "density"),
        ("varblock_sparse", 1024, {"min_block_size": 600, "avg_block_size": 512}, "min_block_size"),
        ("varblock_sparse", 1024, {"heads": 0}, "heads"),
        ("causal_document", 100, {"doc_lengths": [50, 49]}, "doc_lengths"),
        ("causal_document", 100, {"doc_lengths": [50, 51]}, "doc_lengths"),
        ("causal_document", 100, {"doc_lengths": [101, -1]}, "doc_lengths"),
        ("causal_document", 100, {"doc_lengths": [0, 100]}, "doc_lengths"),
        ("full_document", 100, {"doc_lengths": []}, "doc_lengths"),
        ("share_question", 100, {"doc_source": "zipf"}, "doc_source"),
        (
            "causal_document",
            100,
            {"doc_source": "uniform", "min_doc_len": 9, "max_doc_len": 3},
            "min_doc_len",
        ),
        ("causal_blockwise", 100, {"doc_source": "fixed", "doc_len": 0}, "doc_len"),
    ],
)
def test_out_of_range_parameter_named(
    name: str, seqlen: int, params: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(ValueError, match=culprit):
        make_mask(name, seqlen, **params)


@pytest.mark.parametrize(
    ("name", "params", "culprit"),
    [
        ("sliding_window", {"window": "wide"}, "window"),
        ("sliding_window", {"window": 3.5}, "window"),
        ("sliding_window", {"window": True}, "window"),
        ("global_sliding_window", {"global_tokens": "all"}, "global_tokens"),
        ("prefix_lm_causal", {"prefix": "half"}, "prefix"),
        ("block_sparse", {"density": "dense"}, "density"),
        ("block_sparse", {"heads": 2.0}, "heads"),
        ("block_sparse", {"block_size": "64"}, "block_size"),
        ("causal_document", {"doc_source": 3}, "doc_source"),
        ("causal_document", {"doc_lengths": "64,64"}, "doc_lengths"),
        ("causal_document", {"doc_lengths": [64.0, 64.0]}, "doc_lengths"),
    ],
)
def test_wrong_parameter_type_named(name: str, params: dict[str, Any], culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        make_mask(name, 128, **params)


def test_valid_boundary_values_accepted() -> None:
    # The edges of each range are allowed (so the checks above are not over-eager).
    assert make_mask("sliding_window", 16, window=0).area() == 16
    assert make_mask("prefix_lm_causal", 16, prefix=16).area() == 256
    assert make_mask("prefix_lm_causal", 16, prefix=0).area() == 136
    assert make_mask("block_sparse", 64, block_size=16, density=1).area() == 64 * 64
    assert make_mask("block_sparse", 64, block_size=16, density=1.0, heads=2).area() == 2 * 64 * 64
    assert make_mask("block_causal_document", 64, block_size=64).area() == 64 * 64
    assert make_mask("global_sliding_window", 16, window=0, global_tokens=16).area() == 256
    assert make_mask("causal_document", 4, doc_lengths=np.array([1, 3])).area() == 1 + 6


def test_bad_seed_rejected() -> None:
    with pytest.raises(ValueError, match="seed"):
        make_mask("causal_document", 128, seed=-1)


def test_to_dense_above_limit() -> None:
    mask = make_mask("causal", 1 << 15)  # 2^30 elements > the default 2^28 limit
    with pytest.raises(ValueError, match="max_elements"):
        mask.to_dense()
    with pytest.raises(ValueError, match="max_elements"):
        make_mask("causal", 100).to_dense(max_elements=100 * 100 - 1)
    assert make_mask("causal", 100).to_dense(max_elements=100 * 100).sum().item() == 5050
