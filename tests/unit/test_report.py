"""The generated README sections are current, and the support matrix states known facts."""

from __future__ import annotations

import pytest

from lcab.kernels import get_kernel
from lcab.report.readme import README, render
from lcab.report.support import kernel_verdict, strategy_kernels


def test_readme_generated_sections_are_current():
    text = README.read_text()
    assert render(text) == text, "README is stale: run `python -m lcab.report readme`"


def test_render_refuses_a_readme_without_markers():
    with pytest.raises(ValueError, match="generated:kernels"):
        render("# no markers here\n")


@pytest.mark.parametrize(
    ("kernel", "mask", "passes"),
    [
        ("ranges", "share_question", ("fwd", "bwd")),
        ("sparse", "block_sparse", ("fwd", "bwd")),
        ("flex", "causal", ("fwd",)),  # FlexAttention has no CPU backward
        ("fa2", "causal_document", ("fwd", "bwd")),  # varlen: one causal sequence per document
        ("fa2", "sliding_window", ("fwd", "bwd")),  # window_size=(w, w)
        ("fa2", "share_question", ()),  # a query row attends two key ranges
        ("fa3", "prefix_lm_causal", ()),
        ("flashmask", "prefix_lm_document", ("fwd", "bwd")),
        ("ffa", "block_sparse", ()),  # one mask for all heads
        ("sdpa_flash", "causal", ("fwd", "bwd")),
        ("sdpa_flash", "causal_document", ()),  # the flash backend takes no attn_mask
    ],
)
def test_kernel_matrix_cells(kernel, mask, passes):
    assert kernel_verdict(get_kernel(kernel), mask).passes == passes


def test_strategies_take_lse_kernels_only():
    # ring merges partials by LSE: pinned SDPA (no LSE) is out, ranges and sdpa are in
    kernels = strategy_kernels("ring", "causal_document")
    assert "ranges" in kernels and "sdpa" in kernels and "sdpa_math" not in kernels
    # Ulysses runs one local call, no merge: any CPU kernel with a backward
    assert "sdpa_math" in strategy_kernels("ulysses", "causal_document")
    assert "flex" not in strategy_kernels("ulysses", "causal")  # no CPU backward
