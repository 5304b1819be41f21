"""Every guide beside the code is linked from README.md, and no link of the docs is broken."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: Guides are the README.md files beside the code (the front page itself excluded).
GUIDES = sorted(
    [*ROOT.glob("lcab/**/README.md"), ROOT / "launchers/README.md", ROOT / "notebooks/README.md"]
)
DOCS = [README, *GUIDES]


def _targets(path: Path) -> list[str]:
    """The local targets of ``path``'s Markdown links and images, without anchors."""
    links = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    return [t.split("#")[0] for t in links if not re.match(r"[a-z]+:", t) and t.split("#")[0]]


def test_the_package_guides_exist():
    names = {str(p.relative_to(ROOT)) for p in GUIDES}
    for package in ("masks", "kernels", "cp", "bench", "plan", "report", "records", "launch"):
        assert f"lcab/{package}/README.md" in names
    assert {"launchers/README.md", "notebooks/README.md"} <= names


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_links_every_guide(guide):
    assert str(guide.relative_to(ROOT)) in _targets(README)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(doc):
    broken = [t for t in _targets(doc) if not (doc.parent / t).exists()]
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"
