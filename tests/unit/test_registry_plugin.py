"""Registering is all it takes: a plugin's kernel and mask show up in every list lcab derives.

`tests.helpers.registry_plugin` registers a throw-away kernel and mask from outside lcab (and
the mask's test reference). In a fresh interpreter — this session's registries stay as they are
— each must then be found, with no other file edited, in: the support matrices and the kernel
table, the GPU timer's kernels (and the launchers' ``python -m lcab.kernels names``), the
install table, the masks guide's generated list, the plot palette, and the test
parametrisations; and a mask without its reference must fail the mask tests, not be skipped.
The docs type no count of a registry, so none goes stale (checked here for the registries as
they are, and with the plugin's).

Strategies, to come once lcab/cp derives its numerics grid from its registry: the plugin module
registers a throw-away strategy, ``FIND`` adds where it must show (the marked line: the
numerics grid, the strategy matrices, the palette) and the parametrisation test its test ids.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from lcab.kernels import KERNELS
from lcab.masks import list_masks

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "tests.helpers.registry_plugin"
DOCS = [ROOT / "README.md", *sorted((ROOT / "lcab").glob("*/README.md"))]

FIND = textwrap.dedent(
    """
    import contextlib, io, json
    from tests.helpers import registry_plugin as plugin
    from lcab.kernels import list_kernels
    from lcab.kernels.__main__ import main as kernels_cli
    from lcab.kernels.registry import gpu_compared
    from lcab.masks import list_masks
    from lcab.report import support
    from lcab.report.plot_style import palette
    from lcab.report.generated_docs import SECTIONS
    from tests.unit.test_registry_plugin import hand_typed_counts, registry_counts

    k, m = plugin.KERNEL, plugin.MASK
    strategy = support.strategy_matrix_markdown()
    found = {
        "registered": k in list_kernels() and m in list_masks(),
        "kernel table": f"`{k}`" in support.kernel_list_markdown(),
        # the kernel x mask matrix's cell (rendering all of it takes a minute)
        "kernel matrix cell": support.kernel_verdict(support.get_kernel(k), m).passes
        == ("fwd", "bwd"),
        "strategy x mask matrix": f"`{m}`" in strategy and k in strategy,
        "strategy x GPU kernel matrix": k in gpu_compared()
        and support.gpu_strategy_cell("ulysses", k, [m]) == "✓ 1",
        "timer's kernels": k in gpu_compared(),
        "install table": plugin.INSTALL in support.kernel_install_markdown(),
        "masks guide": f"`{m}`" in SECTIONS["masks"](),
        "colour": palette([k])[k] == plugin.COLOUR,
        "docs' counts": hand_typed_counts(registry_counts()) == [],
    }
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        kernels_cli(["packages"])
        kernels_cli(["names", "--gpu-compared", "--sep", ","])
    *packages, names = printed.getvalue().splitlines()
    found["launchers' list"] = k in names.split(",")  # what launchers/gpu_check.sh can call
    found["launchers' packages"] = f"{k}\tnumpy\t{plugin.INSTALL}" in packages
    # strategies: found["numerics grid"] = ... (issue 60 item 1, after the CP rewrite)
    print(json.dumps(found))
    """
)


def registry_counts() -> set[int]:
    """The sizes a doc could type: kernels, GPU-only kernels, masks (with any plugin's)."""
    cuda_only = [n for n in KERNELS.names() if KERNELS.get(n).caps.devices == {"cuda"}]
    return {len(KERNELS.names()), len(cuda_only), len(list_masks())}


def hand_typed_counts(counts: set[int]) -> list[str]:
    """Lines of the guides that type a registry's size ("14 masks"): stale at the next entry."""
    typed = re.compile(r"\b(\d+) (?:[\w-]+ ){0,2}(?:masks|mask patterns|patterns|kernels)\b")
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in DOCS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(int(match.group(1)) in counts for match in typed.finditer(line))
    ]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python args`` at the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_the_guides_type_no_count_of_a_registry() -> None:
    assert hand_typed_counts(registry_counts()) == []


def test_a_plugin_kernel_and_mask_are_in_every_derived_list() -> None:
    done = run("-c", FIND)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: True for name in found} == found


def test_a_plugin_is_in_the_test_parametrisations() -> None:
    done = run(
        "-m", "pytest", "-p", PLUGIN, "--collect-only", "-q", "-p", "no:cacheprovider",
        "tests/unit/test_kernels.py", "tests/unit/test_mask_patterns.py",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    ids = done.stdout
    assert "test_kernel_matches_reference[plugin_naive-plugin_pairs-mha]" in ids
    assert "test_kernel_matches_reference[plugin_naive-causal-gqa]" in ids
    assert "test_pattern_matches_definition[plugin_pairs]" in ids


def test_a_plugin_mask_is_checked_against_its_reference_and_fails_without_one() -> None:
    """Its reference tests and the plugin kernel's numerics on it pass; no reference fails."""
    args = (
        "-m", "pytest", "-p", PLUGIN, "-q", "-p", "no:cacheprovider",
        "tests/unit/test_mask_patterns.py", "tests/unit/test_kernels.py",
        "-k", "plugin_pairs and (not test_kernel_matches_reference or plugin_naive-plugin_pairs)",
    )  # fmt: skip
    done = run(*args)
    assert done.returncode == 0 and "5 passed" in done.stdout, done.stdout[-3000:]
    missing = run(*args, env={"LCAB_PLUGIN_REFERENCE": "0"})
    assert missing.returncode == 1, missing.stdout[-3000:]
    assert "mask 'plugin_pairs' has no reference" in missing.stdout
    assert "skipped" not in missing.stdout.splitlines()[-1]
