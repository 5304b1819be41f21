"""The tiled engine (kernels ``ranges`` and ``sparse``) against the fp64 reference.

Every registered mask pattern, GQA and MHA, per-KV-head masks, restricted sub-masks with
Sq != Sk (including rows that attend nothing), random dense masks, key splitting into
several waves, the multi-worker path, float32/bfloat16 tolerances and a gradcheck.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from lcab.kernels import Problem, get_kernel
from lcab.kernels.ranges import range_items
from lcab.kernels.sparse import block_items
from lcab.kernels.tiled import PreparedTiled, TiledPlan, tiled_attention
from lcab.kernels.tiled import plan as tiled_plan
from lcab.masks import AttnMask, list_masks, make_mask

KERNELS = [("ranges", {"tile": 32}), ("sparse", {"block_size": 16})]
DOCS = {"doc_source": "uniform", "min_doc_len": 5, "max_doc_len": 50}
PARAMS: dict[str, dict[str, Any]] = {
    "full_document": DOCS,
    "causal_document": DOCS,
    "share_question": DOCS,
    "causal_blockwise": DOCS,
    "prefix_lm_document": DOCS,
    "block_causal_document": {"block_size": 8},
    "sliding_window": {"window": 9},
    "sliding_window_causal": {"window": 9},
    "global_sliding_window": {"window": 9, "global_tokens": 5},
    "block_sparse": {"block_size": 16, "heads": 2},
    "varblock_sparse": {"avg_block_size": 24, "min_block_size": 8, "heads": 2},
}


def small_mask(name: str, seqlen: int = 144, seed: int = 3) -> AttnMask:
    return make_mask(name, seqlen, seed=seed, **PARAMS.get(name, {}))


def inputs(
    sq: int, sk: int, hq: int, hkv: int, dtype: torch.dtype = torch.float64, d: int = 16
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(sq * 7 + sk)
    q, k, v = (
        torch.randn(s, h, d, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
        for s, h in ((sq, hq), (sk, hkv), (sk, hkv))
    )
    dout = torch.randn(sq, hq, d, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, dout


def run_with_grads(
    name: str,
    options: dict[str, Any],
    mask: AttnMask,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    out, lse = get_kernel(name, **options)(q, k, v, mask)
    assert lse is not None
    grads = torch.autograd.grad(out, (q, k, v), dout.to(out.dtype))
    return out.detach(), lse.detach(), grads


def assert_matches_reference(
    name: str,
    options: dict[str, Any],
    mask: AttnMask,
    hq: int,
    hkv: int,
    dtype: torch.dtype = torch.float64,
    atol: float = 1e-9,
) -> None:
    q, k, v, dout = inputs(mask.seqlen_q, mask.seqlen_k, hq, hkv, dtype)
    ref_out, ref_lse, ref_grads = run_with_grads("reference", {}, mask, q, k, v, dout)
    out, lse, grads = run_with_grads(name, options, mask, q, k, v, dout)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert lse.dtype == acc and lse.shape == (hq, mask.seqlen_q)
    for t in (out, lse, *grads):
        assert not torch.isnan(t).any()
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse must be -inf exactly where no key"
    assert (lse[~finite] == -torch.inf).all()
    torch.testing.assert_close(
        lse[finite].double(), ref_lse[finite].double(), atol=max(atol, 1e-5), rtol=1e-5
    )
    torch.testing.assert_close(out.double(), ref_out.double(), atol=atol, rtol=atol)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=atol)


@pytest.mark.parametrize(("kernel", "options"), KERNELS, ids=[k for k, _ in KERNELS])
@pytest.mark.parametrize("pattern", list_masks())
def test_every_pattern_gqa_fp64(kernel: str, options: dict[str, Any], pattern: str) -> None:
    assert_matches_reference(kernel, options, small_mask(pattern), hq=4, hkv=2)


@pytest.mark.parametrize(("kernel", "options"), KERNELS, ids=[k for k, _ in KERNELS])
@pytest.mark.parametrize("pattern", ["causal_document", "prefix_lm_causal", "sliding_window"])
def test_mha_fp64(kernel: str, options: dict[str, Any], pattern: str) -> None:
    assert_matches_reference(kernel, options, small_mask(pattern, 100), hq=2, hkv=2)


@pytest.mark.parametrize(("kernel", "options"), KERNELS, ids=[k for k, _ in KERNELS])
@pytest.mark.parametrize(
    ("pattern", "q_range", "k_range"),
    [
        ("causal", (0, 60), (40, 130)),  # rows 0..39 attend nothing
        ("causal_document", (50, 120), (0, 90)),
        ("sliding_window_causal", (100, 144), (0, 60)),  # some rows see nothing
        ("prefix_lm_document", (10, 140), (70, 144)),
        ("block_sparse", (16, 100), (30, 144)),
        ("global_sliding_window", (3, 77), (60, 141)),
    ],
)
def test_restricted_submasks(
    kernel: str,
    options: dict[str, Any],
    pattern: str,
    q_range: tuple[int, int],
    k_range: tuple[int, int],
) -> None:
    mask = small_mask(pattern).restrict(q_range, k_range)
    assert_matches_reference(kernel, options, mask, hq=4, hkv=2)


@pytest.mark.parametrize(("kernel", "options"), KERNELS, ids=[k for k, _ in KERNELS])
@pytest.mark.parametrize("per_head", [False, True])
def test_random_dense_masks(kernel: str, options: dict[str, Any], per_head: bool) -> None:
    rng = np.random.default_rng(5)
    shape = (2, 70, 90) if per_head else (70, 90)
    dense = rng.random(shape) < 0.3
    dense[..., 7, :] = False  # a row with no key
    mask = AttnMask.from_dense(dense)
    assert_matches_reference(kernel, options, mask, hq=4, hkv=2)


def test_empty_rows_are_zero_with_zero_grads() -> None:
    mask = make_mask("causal", 96).restrict((0, 40), (20, 96))  # rows 0..19 see nothing
    q, k, v, dout = inputs(40, 76, 4, 2)
    out, lse = get_kernel("ranges")(q, k, v, mask)
    (dq,) = torch.autograd.grad(out, (q,), dout)
    assert (out[:20] == 0).all() and (lse[:, :20] == -torch.inf).all()
    assert (dq[:20] == 0).all() and torch.isfinite(dq).all()


def assert_plan_matches_reference(plan: TiledPlan, mask: AttnMask, hq: int, hkv: int) -> None:
    """``plan`` run through the engine gives the reference's out, lse and gradients."""
    q, k, v, dout = inputs(mask.seqlen_q, mask.seqlen_k, hq, hkv)
    out, lse = tiled_attention(plan, q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_out, ref_lse, ref_grads = run_with_grads("reference", {}, mask, q, k, v, dout)
    torch.testing.assert_close(out, ref_out, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(lse, ref_lse, atol=1e-9, rtol=1e-9)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("budget", [1 << 10, 1 << 12])
def test_key_splitting_into_waves_matches(budget: int) -> None:
    """A tiny score budget cuts every long row range into key parts merged by lse."""
    mask = small_mask("prefix_lm_document", 160)
    plan = TiledPlan(
        range_items(mask, 32),
        seqlen_q=160,
        seqlen_k=160,
        heads_q=4,
        heads_kv=2,
        shared=True,
        budget_bytes=budget,
    )
    assert plan.waves > 1
    assert_plan_matches_reference(plan, mask, 4, 2)


def test_lse_gradient_matches_reference() -> None:
    """Context parallelism differentiates through the lse too (dS gets dLSE · P)."""
    mask = small_mask("causal_document", 96)
    q, k, v, dout = inputs(96, 96, 4, 2)
    weights = torch.randn(4, 96, dtype=torch.float64)
    grads = []
    for name in ("reference", "ranges"):
        out, lse = get_kernel(name)(q, k, v, mask)
        assert lse is not None
        loss = (out * dout).sum() + (lse * weights).sum()
        grads.append(torch.autograd.grad(loss, (q, k, v)))
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_two_workers_match_one() -> None:
    """The multi-worker path (per-worker grad accumulators) gives the single-worker result."""
    mask = small_mask("block_sparse", 160)
    q, k, v, dout = inputs(160, 160, 4, 2)
    results = []
    keep = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(run_with_grads("sparse", {"block_size": 16}, mask, q, k, v, dout))
    finally:
        torch.set_num_threads(keep)
    (o1, l1, g1), (o2, l2, g2) = results
    torch.testing.assert_close(o1, o2, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(l1, l2)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(("kernel", "options"), KERNELS, ids=[k for k, _ in KERNELS])
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_low_precision_tolerance(
    kernel: str, options: dict[str, Any], dtype: torch.dtype, atol: float
) -> None:
    mask = small_mask("causal_document", 128)
    q, k, v, dout = inputs(128, 128, 4, 2, dtype)
    ref_out, ref_lse, ref_grads = run_with_grads(
        "reference",
        {},
        mask,
        *(t.double().detach().requires_grad_() for t in (q, k, v)),
        dout.double(),
    )
    out, lse, grads = run_with_grads(kernel, options, mask, q, k, v, dout)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    for t in (out, lse, *grads):
        assert not torch.isnan(t).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=atol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=atol, rtol=atol)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, atol=4 * atol, rtol=4 * atol)


def test_gradcheck_tiny() -> None:
    mask = make_mask("causal_document", 12, seed=0, doc_lengths=[5, 7])
    problem = Problem(12, 12, 2, 1, 4, torch.float64)
    prepared = get_kernel("ranges", tile=4).prepare(mask, problem)
    assert isinstance(prepared, PreparedTiled)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(12, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(12, 1, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(12, 1, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: prepared.run(a, b, c), (q, k, v))


def test_sparse_items_follow_the_block_table() -> None:
    """Full key blocks are merged into runs; partial tiles carry their dense masks."""
    items = block_items(make_mask("causal", 64), 16)
    assert items.num_items == 4
    assert items.tiles is not None and len(items.tiles) == 4  # the diagonal tiles
    assert (items.k1 - items.k0).max() == 48  # three full blocks merged in the last row


def test_ranges_cost_follows_area() -> None:
    """Computed scores exceed the attended area by at most the tile staircase."""
    mask = make_mask("causal_document", 4096, seed=0)
    plan = TiledPlan(
        range_items(mask, 128), seqlen_q=4096, seqlen_k=4096, heads_q=1, heads_kv=1, shared=True
    )
    computed = plan.describe()["computed_scores"]
    assert mask.area() <= computed <= 1.2 * mask.area() + 4096 * 128


def test_inplace_change_before_backward_is_caught() -> None:
    """q, k, v, out and lse are saved the autograd way, so stale saves raise, not corrupt."""
    mask = small_mask("causal", 64)
    q, k, v, dout = inputs(64, 64, 4, 2)
    out, _ = get_kernel("ranges")(q, k, v, mask)
    out.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(dout)


def test_view_batches_of_later_waves_merge_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long causal row cut into key parts, each a strided view batch (as at 32K tokens with
    GQA 2:1, where copying the merged rows back onto themselves failed): the reference's."""
    monkeypatch.setattr(tiled_plan, "VIEW_MIN_SCORES", 0)  # views at a test's size
    mask = make_mask("causal", 512)
    plan = TiledPlan(
        range_items(mask, 128),
        seqlen_q=512,
        seqlen_k=512,
        heads_q=2,
        heads_kv=1,
        shared=True,
        budget_bytes=1 << 16,
    )
    assert any(b.view is not None and b.wave > 0 for b in plan.batches)
    assert_plan_matches_reference(plan, mask, 2, 1)
