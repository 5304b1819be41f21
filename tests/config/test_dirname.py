"""Job folders named by long override lists still fit a file name (255 bytes), and stay unique."""

from __future__ import annotations

from lcab.config.schema import DIRNAME_MAX, short_dirname


def test_short_names_are_kept_and_long_ones_cut_with_a_hash_of_the_whole():
    short = "cp=ring,mask=causal"
    assert short_dirname(short) == short
    base = ",".join(f"bench.key{i}=value{i}" for i in range(30))
    a, b = short_dirname(base + ",mask=causal"), short_dirname(base + ",mask=causal_document")
    assert len(a.encode()) <= DIRNAME_MAX and len(b.encode()) <= DIRNAME_MAX
    assert a != b  # names that differ only past the cut stay apart
    assert a.startswith(base[:100])
