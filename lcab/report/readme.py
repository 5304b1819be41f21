"""Generated README sections: text between ``<!-- BEGIN generated:NAME -->`` and its END marker.

`python -m lcab.report readme` rewrites them from the registries; a test fails when the
committed README differs from what the code generates, so the README cannot go stale.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from lcab.report.gpu_verification import read_verification, verification_markdown
from lcab.report.support import (
    VERIFICATION_FILE,
    gpu_strategy_matrix_markdown,
    kernel_list_markdown,
    kernel_matrix_markdown,
    strategy_matrix_markdown,
)

README = Path(__file__).resolve().parents[2] / "README.md"


def committed_gpu_table() -> str:
    """The verification table of the committed GPU run (the support matrix's ``G`` source)."""
    if not VERIFICATION_FILE.exists():
        return "No GPU verification records."
    return verification_markdown(read_verification(VERIFICATION_FILE))


SECTIONS: dict[str, Callable[[], str]] = {
    "kernels": kernel_list_markdown,
    "kernel-matrix": kernel_matrix_markdown,
    "strategy-matrix": strategy_matrix_markdown,
    "gpu-strategy-matrix": gpu_strategy_matrix_markdown,
    "gpu-verification": committed_gpu_table,
}


def _pattern(name: str) -> re.Pattern[str]:
    tag = re.escape(name)
    return re.compile(
        rf"(<!-- BEGIN generated:{tag} -->\n)(.*?)(<!-- END generated:{tag} -->)", re.DOTALL
    )


def render(text: str) -> str:
    """``text`` with every generated section replaced by its current content.

    Raises:
        ValueError: a section's markers are missing from ``text``.

    """
    for name, make in SECTIONS.items():
        pattern = _pattern(name)
        if not pattern.search(text):
            raise ValueError(f"README has no '<!-- BEGIN generated:{name} -->' ... END markers")
        body = make().rstrip("\n") + "\n"
        text = pattern.sub(_replacer(body), text)
    return text


def _replacer(body: str) -> Callable[[re.Match[str]], str]:
    """A substitution keeping the markers (``body`` is literal text, not a regex template)."""
    return lambda match: match.group(1) + body + match.group(3)


def update(path: Path = README) -> bool:
    """Rewrite the generated sections of ``path``; True when something changed."""
    old = path.read_text()
    new = render(old)
    if new != old:
        path.write_text(new)
    return new != old
