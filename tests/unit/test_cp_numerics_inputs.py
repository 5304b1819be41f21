"""Seeded inputs drawn in parts, and the streamed per-KV-head fp64 reference.

A rank draws only its own shard of q/k/v/dout, and rank 0's reference streams K/V in key
chunks; both must give exactly the numbers of the whole tensors, and the streamed reference
must equal an independent dense one (K/V repeated per query head, one softmax per row, dq by
autograd) for MHA, GQA, per-KV-head masks and rows that attend to nothing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lcab.bench.inputs import BLOCK_TOKENS, SeededInputs
from lcab.bench.numerics import reference_bytes
from lcab.kernels import Problem, get_kernel
from lcab.kernels.reference import RowWindow, streamed_rows
from lcab.masks import AttnMask, make_mask


def source(seqlen=700, hq=6, hkv=2, dtype=torch.float32, seed=3) -> SeededInputs:
    return SeededInputs(seed, seqlen, 0, Problem(seqlen, seqlen, hq, hkv, 5, dtype))


def test_any_part_equals_the_same_rows_of_the_whole():
    src = source()
    whole = {n: src.whole(n) for n in ("q", "k", "v", "dout")}
    assert whole["q"].shape == (700, 6, 5) and whole["k"].shape == (700, 2, 5)
    index = torch.tensor([699, 3, 128, 127, 500, 3])  # any order, repeats, block edges
    for name, tensor in whole.items():
        assert torch.equal(src.rows(name, index), tensor[index])
        assert torch.equal(src.span(name, 250, 390), tensor[250:390])
    # a shard with padding slots: zeros there, the tokens elsewhere
    layout = torch.tensor([10, 11, -1, 640, -1])
    shard = src.shard("v", layout)
    assert torch.equal(shard[[0, 1, 3]], whole["v"][[10, 11, 640]])
    assert not shard[[2, 4]].any()


def test_draws_are_seeded_distinct_and_independent_of_the_drawer():
    a, b = source(seed=3), source(seed=3)
    assert torch.equal(a.rows("q", torch.tensor([5, 600])), b.span("q", 0, 700)[[5, 600]])
    assert not torch.equal(source(seed=4).span("q", 0, 50), a.span("q", 0, 50))
    assert not torch.equal(a.span("q", 0, BLOCK_TOKENS), a.span("dout", 0, BLOCK_TOKENS)[:, :6])
    blocks = a.span("k", 0, 2 * BLOCK_TOKENS)
    assert not torch.equal(blocks[:BLOCK_TOKENS], blocks[BLOCK_TOKENS:])
    with pytest.raises(IndexError):
        a.rows("q", torch.tensor([700]))


def dense_reference(q, k, v, allowed, dout):
    """Independent: K/V repeated to every query head, masked softmax, dq by autograd."""
    group = q.shape[1] // k.shape[1]
    q = q.clone().requires_grad_(True)
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if allowed.shape[0] > 1:
        allowed = allowed.repeat_interleave(group, 0)
    scores = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", probs, vv)
    (dq,) = torch.autograd.grad(out, q, dout)
    return out.detach(), lse.detach(), dq


def per_head_mask(seqlen: int) -> AttnMask:
    """Head 0 causal; head 1 a band from query 1 on, so its query 0 attends to nothing."""
    slices = np.array([[0, seqlen, 0, seqlen, 1], [1, seqlen, 0, seqlen - 1, 3]], dtype=np.int64)
    return AttnMask(slices, seqlen, head_ptr=np.array([0, 1, 2]))


@pytest.mark.parametrize(
    ("mask_name", "hq", "hkv"),
    [("causal", 4, 4), ("causal_document", 6, 2), ("sliding_window", 6, 1), ("per_head", 4, 2)],
)
def test_streamed_rows_equal_an_independent_dense_reference(mask_name, hq, hkv):
    seqlen = 300
    if mask_name == "per_head":
        mask = per_head_mask(seqlen)
    else:
        params = {"window": 7} if mask_name == "sliding_window" else {}
        if mask_name == "causal_document":
            params = {"doc_source": "uniform", "min_doc_len": 3, "max_doc_len": 40}
        mask = make_mask(mask_name, seqlen, seed=2, **params)
    src = source(seqlen, hq, hkv, torch.float64)
    x = {n: src.whole(n) for n in ("q", "k", "v", "dout")}
    allowed = mask.to_dense()
    allowed = allowed.unsqueeze(0) if allowed.dim() == 2 else allowed
    ref_out, ref_lse, ref_dq = dense_reference(x["q"], x["k"], x["v"], allowed, x["dout"])
    rows = torch.tensor([0, 1, 2, 77, 150, 299])
    keys_seen = []

    def keys(a, b):
        keys_seen.append((a, b))
        return src.span("k", a, b), src.span("v", a, b)

    # a budget of a few keys per chunk: many chunks, so the online softmax is exercised
    out, lse, dq = streamed_rows(
        x["q"][rows], rows, mask, keys, hkv, x["dout"][rows], chunk_bytes=40 * 1024
    )
    assert len(keys_seen) > 4 and max(b - a for a, b in keys_seen) < seqlen
    assert torch.allclose(out, ref_out[rows], atol=1e-12)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse[:, rows]))
    finite = torch.isfinite(lse)
    assert torch.allclose(lse[finite], ref_lse[:, rows][finite], atol=1e-12)
    assert torch.allclose(dq, ref_dq[rows], atol=1e-12)
    if mask_name == "per_head":
        assert torch.isinf(lse[2:, 0]).all() and not out[0, 2:].any()  # query 0, head 1


def test_row_window_matches_the_dense_mask_in_any_key_chunk():
    mask = make_mask(
        "causal_document", 200, seed=5, doc_source="uniform", min_doc_len=2, max_doc_len=30
    )
    rows = torch.tensor([0, 17, 18, 150, 199])
    window = RowWindow(mask, rows)
    dense = mask.to_dense()
    for a, b in [(0, 200), (0, 1), (15, 40), (190, 200)]:
        assert torch.equal(window.allowed(0, a, b), dense[rows][:, a:b])


def test_full_reference_groups_query_heads_instead_of_repeating_kv():
    mask = make_mask("causal", 64)
    src = source(64, 6, 2, torch.float64)
    q, k, v, dout = (src.whole(n) for n in ("q", "k", "v", "dout"))
    out, lse = get_kernel("reference")(q, k, v, mask)
    ref_out, ref_lse, _ = dense_reference(q, k, v, mask.to_dense().unsqueeze(0), dout)
    assert torch.allclose(out, ref_out, atol=1e-12) and torch.allclose(lse, ref_lse, atol=1e-12)


def test_reference_bytes_sampled_mode_does_not_grow_with_length():
    short = reference_bytes(32, 8, 128, 65536, rows=128)
    long = reference_bytes(32, 8, 128, 96 * 8192, rows=128)
    assert short == long
    # full mode holds the whole score tensor for the backward: quadratic in the length
    assert reference_bytes(8, 8, 64, 2048, None) > 3 * 8 * 2048 * 2048 * 8


def test_the_sampled_reference_draws_every_seeded_block_once(monkeypatch):
    """Rank 0's streamed reference asks the seeded source for each block once, not twice.

    At these sizes the reference's memory budget gives key chunks of 1012 keys, which do not
    line up with the 128-token seeded blocks: before, each block a chunk boundary fell in was
    drawn by both chunks, and the dq pass drew every K/V block again.
    """
    from collections import Counter

    from lcab.bench.numerics import Reference
    from lcab.kernels.reference import sample_rows

    seqlen, hq, hkv, head_dim = 2000, 8, 2, 16
    src = SeededInputs(5, seqlen, 0, Problem(seqlen, seqlen, hq, hkv, head_dim, torch.float32))
    mask = make_mask("causal", seqlen)
    rows = sample_rows(seqlen, 256, seed=1)
    draws: Counter[tuple[str, int]] = Counter()
    real = SeededInputs._block

    def counted(self, name, block):
        draws[(name, block)] += 1
        return real(self, name, block)

    monkeypatch.setattr(SeededInputs, "_block", counted)
    reference = Reference(mask, src, rows)
    out, lse = reference.forward()
    dq = reference.grads()["dq"]
    blocks = math.ceil(seqlen / BLOCK_TOKENS)
    for name in ("k", "v"):
        assert sorted(b for n, b in draws if n == name) == list(range(blocks)), name
    for name in ("q", "dout"):  # the blocks the sampled rows fall in
        assert {b for n, b in draws if n == name} == set((rows // BLOCK_TOKENS).tolist())
    assert set(draws.values()) == {1}, {key: n for key, n in draws.items() if n > 1}
    # the same numbers as the reference chunked another way (few keys per chunk, unaligned)
    monkeypatch.setattr(SeededInputs, "_block", real)
    keys = lambda a, b: (src.span("k", a, b), src.span("v", a, b))  # noqa: E731
    other = streamed_rows(
        src.rows("q", rows), rows, mask, keys, hkv, src.rows("dout", rows), chunk_bytes=1 << 20
    )
    assert torch.allclose(out, other[0], atol=1e-12) and torch.allclose(dq, other[2], atol=1e-12)
    assert torch.allclose(lse, other[1], atol=1e-12)
