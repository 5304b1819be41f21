"""The generated doc sections are current, and the support matrix states known facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from lcab.kernels import get_kernel
from lcab.report.generated_docs import (
    GENERATED_FILES,
    ROOT,
    SECTIONS,
    render,
    render_all,
    sections_in,
)
from lcab.report.support import kernel_verdict, strategy_kernels


@pytest.mark.parametrize("path", GENERATED_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_sections_are_current(path):
    text = path.read_text()
    assert render(text, path) == text, f"{path} is stale: run `python -m lcab.report docs`"


def test_every_generated_section_has_a_place():
    # a table dropped while moving text between guides would otherwise vanish unnoticed
    found = [name for path in GENERATED_FILES for name in sections_in(path.read_text())]
    assert sorted(set(found)) == sorted(SECTIONS)


def test_render_all_refuses_files_that_drop_a_section(tmp_path):
    guide = tmp_path / "README.md"
    guide.write_text("<!-- BEGIN generated:kernels -->\n<!-- END generated:kernels -->\n")
    with pytest.raises(ValueError, match="kernel-matrix"):
        render_all([guide])


def test_render_fills_markdown_and_yaml_sections():
    markdown = render(
        "a\n<!-- BEGIN generated:kernels -->\nold\n<!-- END generated:kernels -->\nb\n"
    )
    assert "old" not in markdown and "| `ranges` |" in markdown
    assert markdown.startswith("a\n") and markdown.endswith("<!-- END generated:kernels -->\nb\n")
    yaml = render("# BEGIN generated:help\n# END generated:help\n", Path("help.yaml"))
    assert yaml.startswith("# BEGIN generated:help\ntemplate: |\n")
    assert "\n  kernel: " in yaml and "guide: lcab/kernels/README.md" in yaml


def test_render_refuses_unknown_or_unclosed_sections():
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        render("<!-- BEGIN generated:nope -->\n<!-- END generated:nope -->\n")
    with pytest.raises(ValueError, match="no matching END"):
        render("<!-- BEGIN generated:kernels -->\nno end\n")
    with pytest.raises(ValueError, match="no matching END"):  # YAML markers in Markdown
        render("<!-- BEGIN generated:kernels -->\n# END generated:kernels\n")


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
