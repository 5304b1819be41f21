"""The FA2 table (`lcab.kernels.upstream.flash_attn`) held to flash-attn's own source.

flash-attn needs CUDA to import, but its sdist on PyPI carries ``flash_attn_interface.py``, the
file the wheel installs: every FA2 row's parameters, their order, defaults and keyword-only
marks must be the ones that file defines. A row that says what the library does not fails here.
FA3 (hopper build) and FFA (MagiAttention) are not on PyPI: their rows are read from the commits
they cite, and the stand-ins in ``tests/helpers`` are built from those rows.
"""

from __future__ import annotations

import os

import pytest

from lcab.kernels.upstream import flash_attn as table
from lcab.kernels.upstream.facts import UpstreamFunction
from tests.helpers.upstream_source import function_signature, sdist_member

VERSION = "2.8.3.post2"


@pytest.fixture(scope="module")
def interface_source() -> str:
    text = sdist_member("flash-attn", VERSION, "flash_attn/flash_attn_interface.py")
    if text is None:
        if os.environ.get("CI"):
            pytest.fail("CI could not download the flash-attn sdist from PyPI")
        pytest.skip("flash-attn sdist not downloadable here (no PyPI)")
    return text


@pytest.mark.parametrize("row", table.FA2_ROWS, ids=lambda r: r.name)
def test_fa2_row_matches_the_sdist_source(row: UpstreamFunction, interface_source: str) -> None:
    real = function_signature(interface_source, row.name)
    assert row.params == real.params
    assert dict(row.defaults) == real.defaults
    assert row.keyword_only == real.keyword_only


def test_source_check_catches_a_wrong_row(interface_source: str) -> None:
    """The comparison can fail: FA3's backward row is not FA2's function."""
    real = function_signature(interface_source, "_flash_attn_backward")
    assert table.FA3_BACKWARD.params != real.params


def test_fa2_public_calls_pad_head_dim_and_the_private_backward_does_not(
    interface_source: str,
) -> None:
    """The fact the adapter's backward relies on (it pads to a multiple of 8 itself)."""
    public_forward = interface_source[interface_source.index("class FlashAttnFunc") :]
    assert "head_size_og % 8 != 0" in public_forward.split("def flash_attn_qkvpacked_func")[0]
    private = interface_source[
        interface_source.index("def _flash_attn_backward(") : interface_source.index(
            "def _flash_attn_backward_fake("
        )
    ]
    assert "pad" not in private
