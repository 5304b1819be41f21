"""``python -m lcab.main --help`` lists the groups a user picks and the guide of each.

The expectation comes from Hydra's own config repository (the groups and options it would
compose), not from the folder scan that generates the help text, and the schema groups are
checked to exist there, so their absence from the help is a real filter, not a missing source.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from lcab.config import CONF_DIR, register_configs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def help_text() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "lcab.main", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


@pytest.fixture(scope="module")
def hydra_groups() -> dict[str, list[str]]:
    """Every top-level group Hydra can compose for the app, with its options."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            groups = {}
            for parent in loader.list_groups(""):
                for name in [parent, *(f"{parent}/{g}" for g in loader.list_groups(parent))]:
                    options = sorted(loader.get_group_options(name))
                    if options:
                        groups[name] = options
            return groups
    finally:
        GlobalHydra.instance().clear()


def test_help_lists_every_user_group_with_its_options(help_text, hydra_groups):
    user = {g: o for g, o in hydra_groups.items() if not g.startswith(("schema/", "hydra"))}
    assert {"kernel", "cp", "mask", "topology", "launcher"} <= set(user)
    for group, options in user.items():
        assert f"\n{group}: {', '.join(options)}\n" in help_text, group


def test_help_hides_the_schema_groups(help_text, hydra_groups):
    assert any(g.startswith("schema/") for g in hydra_groups)  # they exist in Hydra ...
    assert not re.search(r"^schema/", help_text, re.MULTILINE)  # ... but not in the help


def test_help_names_an_existing_guide_for_every_group(help_text, hydra_groups):
    guides = dict(re.findall(r"^(\w+): .*\n    .*; guide: (\S+)$", help_text, re.MULTILINE))
    user = {g for g in hydra_groups if not g.startswith(("schema/", "hydra"))}
    assert set(guides) == user
    for group, guide in guides.items():
        assert (ROOT / guide).is_file(), f"{group}: {guide} does not exist"


def test_help_still_shows_the_config(help_text):
    assert re.search(r"^dry_run: false$", help_text, re.MULTILINE)
    assert "--hydra-help" in help_text
