"""Registering is all it takes: a plugin's kernel, mask and strategy show up in every list.

`tests.helpers.registry_plugin` registers a throw-away kernel, mask (and the mask's test
reference) and CP strategy (Ring P2P under another name) from outside lcab. In a fresh
interpreter — this session's registries stay as they are — each must then be found, with no
other file edited, in: the support matrices and the kernel table, the GPU timer's kernels (and
the launchers' ``python -m lcab.kernels names``), the install table, the masks guide's generated
list, the plot palette, and the test parametrisations; and a mask without its reference must
fail the mask tests, not be skipped. The strategy must be in the gloo numerics grid (and run
there: one case, forward and backward against fp64), the one-GPU CP step's configs, the
schedule check (and its guide section) and the planner's candidates, priced as the ring it is.
The docs type no count of a registry, so none goes stale (checked here for the registries as
they are, and with the plugin's).
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
    import contextlib, io, json, tempfile
    from pathlib import Path
    from tests.helpers import registry_plugin as plugin
    from lcab.cp.schedule_check import grid_cell, schedule_markdown
    from lcab.kernels import list_kernels
    from lcab.kernels.__main__ import main as kernels_cli
    from lcab.kernels.registry import gpu_compared
    from lcab.masks import list_masks
    from lcab.report import support
    from lcab.plan import load_profile
    from lcab.plan.predict import PlanCell, predict
    from lcab.plan.recommend import candidates
    from lcab.report.plot_style import SERIES_COLOURS, palette
    from lcab.report.generated_docs import SECTIONS
    from tests.distributed import test_cp_grid
    from tests.distributed.grid import run_grid
    from tests.gpu.cp_shared import CONFIGS
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
    s = plugin.STRATEGY
    rows = dict(r.split(" | ", 1) for r in strategy.splitlines() if " | " in r)
    found["strategy x mask matrix row"] = rows.get(f"| `{s}`") == rows["| `ring`"]
    found["strategy x GPU kernel matrix row"] = support.gpu_strategy_cell(s, k, [m]) == "✓ 1" and (
        support.gpu_strategy_cell(s, "fa3", [m, "causal"])
        == support.gpu_strategy_cell("ring", "fa3", [m, "causal"])
    )
    grid = [c for c in test_cp_grid.cases(2) if c.strategy == s]
    rings = [c for c in test_cp_grid.cases(2) if c.strategy == "ring"]
    found["numerics grid"] = len(grid) == len(rings)
    with tempfile.TemporaryDirectory() as workdir:
        one = [c for c in grid if c.mask == "causal_document"][:1]
        ran = run_grid(2, one, Path(workdir), rank_fn=plugin.rank_main)
        found["numerics grid runs it"] = [o.status for o in ran] == ["ok"]
    found["one-GPU CP configs"] = (s, (), 2) in CONFIGS
    found["schedule check"] = grid_cell(s, "causal_document", 16).text().endswith("matches")
    found["schedule guide"] = f"`{s}` ({plugin.PluginRing.summary})" in schedule_markdown()
    cell = PlanCell(s, "fa3", "causal_document", 65536, 2, 8, 32, 8, 128, "bfloat16")
    found["planner's candidates"] = s in {c.cp for c in candidates(cell)}
    h100 = load_profile("h100_nvlink_ib")
    mine, ring = predict(cell, h100), predict(cell.with_(cp="ring"), h100)
    priced = [(p.fwd, p.bwd, p.memory_mib) for p in (mine, ring)]
    found["planner prices it"] = priced[0] == priced[1]
    found["strategy colour"] = palette(["loongtrain", s])[s] in SERIES_COLOURS and (
        palette(["loongtrain", s])[s] == palette(["loongtrain", s + "/fa3"])[s + "/fa3"]
    )
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


def test_a_plugin_kernel_mask_and_strategy_are_in_every_derived_list() -> None:
    done = run("-c", FIND)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: True for name in found} == found


def test_a_plugin_is_in_the_test_parametrisations() -> None:
    done = run(
        "-m", "pytest", "-p", PLUGIN, "--collect-only", "-q", "-p", "no:cacheprovider",
        "tests/unit/test_kernels.py", "tests/unit/test_mask_patterns.py",
        "tests/unit/test_cp_schedule_grid.py", "tests/unit/test_plan_replay.py",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    ids = done.stdout
    assert "test_kernel_matches_reference[plugin_naive-plugin_pairs-mha]" in ids
    assert "test_kernel_matches_reference[plugin_naive-causal-gqa]" in ids
    assert "test_pattern_matches_definition[plugin_pairs]" in ids
    assert (
        "test_every_rank_keeps_the_schedule_and_the_replay_moves_what_it_records[plugin_ring-96-8]"
        in ids
    )
    assert "test_replay_sends_exactly_the_plan_bytes_per_rank[plugin_ring-zigzag-causal-4-4]" in ids


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
