"""``--help`` answers without torch and prints what Hydra's own help prints.

``lcab.config.help`` answers ``python -m lcab.main --help`` and ``python -m lcab.plan --help``
from lcab's generated template and a cached composition. The expectation here is Hydra's own
help, produced by calling the decorated apps directly (Hydra's ``app_help``, with its walk over
every group), and the modules loaded by the real command (``python -X importtime``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lcab.config import CONF_DIR
from lcab.config import help as fast_help

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


def _python(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "LCAB_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _hydra_help(module: str, *overrides: str, cache: Path) -> str:
    """Hydra's own ``--help`` of the app in ``module`` (its decorated ``app``, called directly)."""
    code = (
        "import sys; from lcab.config import register_configs; register_configs(); "
        f"from {module} import app; sys.argv = ['app', '--help', *sys.argv[1:]]; app()"
    )
    result = _python("-c", code, *overrides, cache=cache)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _loaded(module: str, *args: str, cache: Path) -> tuple[str, set[str]]:
    """The output of ``python -m module args`` and the modules it imported."""
    result = _python("-X", "importtime", "-m", module, *args, cache=cache)
    assert result.returncode == 0, result.stderr[-2000:]
    modules = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", result.stderr, re.M))
    assert "lcab.config.help" in modules or "lcab.main" in modules  # importtime was read
    return result.stdout, modules


@pytest.mark.parametrize("module", ["lcab.main", "lcab.plan.cli", "lcab.config"])
def test_importing_the_entry_points_leaves_torch_and_the_bench_stack_out(module, tmp_path):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    result = _python("-c", code, cache=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(result.stdout.split())
    assert module in loaded  # the list was read
    assert not {m for m in loaded if m.split(".")[0] == "torch"}
    heavy = ("lcab.bench", "lcab.kernels", "lcab.cp", "lcab.masks", "lcab.plan.predict")
    assert not {m for m in loaded if m.startswith(heavy)}


@pytest.mark.parametrize("module", ["lcab.main", "lcab.plan"])
def test_help_imports_no_torch_once_composed(module, tmp_path):
    first, _ = _loaded(module, "--help", cache=tmp_path)  # composes: torch loads once
    again, modules = _loaded(module, "--help", cache=tmp_path)
    assert again == first
    assert not {m for m in modules if m.split(".")[0] == "torch"}
    assert not {m for m in modules if m.startswith(("lcab.kernels", "lcab.cp", "lcab.bench"))}


@pytest.mark.slow
def test_main_help_is_hydras_help_character_for_character(tmp_path):
    ours = _python("-m", "lcab.main", "--help", cache=tmp_path)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert ours.stdout == _hydra_help("lcab.main", cache=tmp_path)
    # an override changes the config shown, in both
    fa3 = _python("-m", "lcab.main", "kernel=fa3", "-m", "--help", cache=tmp_path)
    assert "  name: fa3\n" in fa3.stdout and "  name: ranges\n" not in fa3.stdout
    assert fa3.stdout == _hydra_help("lcab.main", "kernel=fa3", cache=tmp_path)


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


@pytest.mark.slow
def test_plan_help_lists_the_groups_of_main_and_shows_hydras_config(tmp_path):
    plan = _python("-m", "lcab.plan", "--help", cache=tmp_path)
    main = _python("-m", "lcab.main", "--help", cache=tmp_path)
    assert plan.returncode == main.returncode == 0, plan.stderr[-2000:] + main.stderr[-2000:]
    groups = _section(main.stdout, "== Config groups", "== Config ==")
    assert "\nkernel: " in groups and "\nhardware: " in groups
    assert _section(plan.stdout, "== Config groups", "== Config ==") == groups
    assert plan.stdout.startswith("lcab planner") and "python -m lcab.plan" in plan.stdout
    # the config: what Hydra's default help prints for conf/plan.yaml
    hydras = _hydra_help("lcab.plan.app", cache=tmp_path)
    config = _section(hydras, "\nkernel:\n", "\n\nPowered by Hydra")
    assert "hardware:\n  name: h100_nvlink_ib" in config
    assert config + "\nGuides: README.md" in plan.stdout


def test_a_bad_override_in_help_is_one_line_and_exit_2(tmp_path):
    result = _python("-m", "lcab.main", "kernel=no_such_kernel", "--help", cache=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_kernel" in lines[0], result.stderr


def test_other_hydra_flags_are_left_to_hydra():
    assert fast_help.fast_help_applies(["--help", "-m", "kernel=fa3"])
    assert not fast_help.fast_help_applies(["kernel=fa3"])
    for flag in ("--resolve", "--cfg", "--config-name=x", "-cn", "--info", "--hydra-help"):
        assert not fast_help.fast_help_applies(["--help", flag]), flag


def test_the_cache_is_read_and_keyed_by_config_overrides_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("LCAB_CACHE_DIR", str(tmp_path / "cache"))
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    monkeypatch.setattr(fast_help, "CONF_DIR", conf)
    calls: list[tuple[str, list[str]]] = []

    def compose(name: str, overrides: list[str]) -> str:
        calls.append((name, list(overrides)))
        return f"composed {name} {overrides}\n"

    monkeypatch.setattr(fast_help, "compose_yaml", compose)
    assert fast_help.composed_yaml("config", ["kernel=fa3"]) == "composed config ['kernel=fa3']\n"
    assert fast_help.composed_yaml("config", ["kernel=fa3"]) == "composed config ['kernel=fa3']\n"
    assert len(calls) == 1  # the second answer came from the cache
    fast_help.composed_yaml("config", ["kernel=fa2"])
    fast_help.composed_yaml("plan", ["kernel=fa3"])
    assert len(calls) == 3
    before = fast_help.fingerprint()
    option = conf / "kernel" / "fa3.yaml"
    option.write_text(option.read_text() + "\n# edited\n")
    assert fast_help.fingerprint() != before
    fast_help.composed_yaml("config", ["kernel=fa3"])
    assert len(calls) == 4  # an edited conf/ file composes again


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("LCAB_CACHE_DIR", str(blocked))
    monkeypatch.setattr(fast_help, "compose_yaml", lambda name, overrides: "composed\n")
    assert fast_help.composed_yaml("config", []) == "composed\n"
