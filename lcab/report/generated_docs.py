"""Generated sections of the docs: text between ``BEGIN generated:NAME`` and its END marker.

The guides (``lcab/*/README.md``) and ``python -m lcab.main --help`` carry tables made from the
registries; `python -m lcab.report docs` rewrites every section of `GENERATED_FILES`, and a test
fails when a committed file differs, so no table goes stale. Every section must appear in some
file, so moving text between guides cannot drop a table.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from lcab.config import CONF_DIR
from lcab.cp.schedule_check import schedule_markdown
from lcab.report.gpu_verification import (
    cp_verification_markdown,
    read_verification,
    verification_markdown,
)
from lcab.report.support import (
    VERIFICATION_FILE,
    gpu_strategy_matrix_markdown,
    kernel_install_markdown,
    kernel_list_markdown,
    kernel_matrix_markdown,
    mask_list_markdown,
    strategy_matrix_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HELP_TEMPLATE = CONF_DIR / "hydra" / "help" / "lcab.yaml"

#: Every file that holds generated sections (the README, a front page, holds none).
GENERATED_FILES: tuple[Path, ...] = (
    ROOT / "lcab" / "kernels" / "README.md",
    ROOT / "lcab" / "masks" / "README.md",
    ROOT / "lcab" / "cp" / "README.md",
    HELP_TEMPLATE,
)

#: The config groups of ``python -m lcab.main``: what each sets and the guide that explains it.
#: A folder of ``conf/`` missing here stops `help_template` (document a new group before use).
GROUP_GUIDES: dict[str, tuple[str, str]] = {
    "kernel": ("the attention kernel", "lcab/kernels/README.md"),
    "cp": ("the context-parallel strategy (cp.balance, cp.ulysses_degree)", "lcab/cp/README.md"),
    "mask": ("the mask; its parameters are fields (mask.window=512)", "lcab/masks/README.md"),
    "seqlen": ("the lengths one job sweeps (seqlen.values=[4096])", "lcab/bench/README.md"),
    "topology": ("nodes x devices per node (topology.nodes=N)", "lcab/cp/README.md"),
    "bench": ("the measurement protocol", "lcab/bench/README.md"),
    "logger": ("extra sinks: W&B", "lcab/records/README.md"),
    "launcher": ("where jobs run: local processes or SLURM", "lcab/launch/README.md"),
    "experiment": ("presets of a whole setting (experiment=NAME)", "lcab/bench/README.md"),
    "sweep": ("sweep presets, added with +sweep=NAME", "lcab/bench/README.md"),
    "debug": ("the smallest useful run", "lcab/bench/README.md"),
    "hardware": ("the planner's hardware profile (python -m lcab.plan)", "lcab/plan/README.md"),
}


def committed_gpu_table() -> str:
    """The committed GPU run's tables: kernel x mask, then strategy x kernel when it has CP rows."""
    if not VERIFICATION_FILE.exists():
        return "No GPU verification records."
    table = verification_markdown(read_verification(VERIFICATION_FILE))
    cp_rows = read_verification(VERIFICATION_FILE, cp=True)
    return table + ("\n\n" + cp_verification_markdown(cp_rows) if cp_rows else "")


def user_groups(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """The config groups of ``conf/`` a user picks, with their options (not the schemas)."""
    groups = {}
    for folder in sorted(p for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"):
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        if options:
            groups[folder.name] = options
    return groups


def help_template() -> str:
    """The ``python -m lcab.main --help`` template (ValueError: a group without `GROUP_GUIDES`)."""
    groups = user_groups()
    missing = sorted(set(groups) - set(GROUP_GUIDES))
    if missing:
        raise ValueError(f"conf/ groups without a guide in GROUP_GUIDES: {', '.join(missing)}")
    lines = [
        "lcab, the long-context attention benchmark. One job runs one cell (kernel x cp x mask",
        "x topology) over a list of sequence lengths; -m sweeps comma-separated options.",
        "",
        "  python -m lcab.main                       # the default CPU benchmark",
        "  python -m lcab.main -m kernel=sdpa,ranges cp=none,ring mask=causal,document",
        "  python -m lcab.main ... dry_run=true      # shapes and GPU-hours; runs nothing",
        "",
        "== Config groups (group=option) ==",
    ]
    for name, options in groups.items():
        what, guide = GROUP_GUIDES[name]
        lines += [f"{name}: {', '.join(options)}", f"    {what}; guide: {guide}"]
    lines += [
        "",
        "== Config ==",
        "Override any field (foo.bar=value); a misspelled key or a bad value stops with exit 2.",
        "Also: problem.* (shape, dtype, device), seed, resume=true, dry_run=true.",
        "",
        "$CONFIG",
        "Guides: README.md (start here), lcab/<package>/README.md, launchers/README.md,",
        "notebooks/README.md. Hydra's own flags: --hydra-help.",
    ]
    body = "\n".join(f"  {line}" if line else "" for line in lines)
    return f"template: |\n{body}"


SECTIONS: dict[str, Callable[[], str]] = {
    "kernels": kernel_list_markdown,
    "kernel-install": kernel_install_markdown,
    "masks": mask_list_markdown,
    "kernel-matrix": kernel_matrix_markdown,
    "strategy-matrix": strategy_matrix_markdown,
    "gpu-strategy-matrix": gpu_strategy_matrix_markdown,
    "cp-schedules": schedule_markdown,
    "gpu-verification": committed_gpu_table,
    "help": help_template,
}

_MARKERS = {"md": ("<!-- BEGIN generated:{} -->", "<!-- END generated:{} -->")}
_YAML_MARKERS = ("# BEGIN generated:{}", "# END generated:{}")
_ANY_BEGIN = re.compile(r"(?:<!--|#) BEGIN generated:([\w-]+)")


def _markers(path: Path) -> tuple[str, str]:
    """The comment syntax of ``path``'s markers: HTML comments in Markdown, ``#`` in YAML."""
    return _YAML_MARKERS if path.suffix in (".yaml", ".yml") else _MARKERS["md"]


def _pattern(name: str, markers: tuple[str, str]) -> re.Pattern[str]:
    begin, end = (re.escape(m.format(name)) for m in markers)
    return re.compile(rf"({begin}\n)(.*?)({end})", re.DOTALL)


def sections_in(text: str) -> list[str]:
    """The names of the generated sections ``text`` marks, in order."""
    return _ANY_BEGIN.findall(text)


def render(text: str, path: Path = README) -> str:
    """``text`` (of ``path``) with its sections made current (ValueError: a bad marker)."""
    markers = _markers(path)
    for name in sections_in(text):
        if name not in SECTIONS:
            raise ValueError(f"{path}: unknown generated section {name!r}; known: {list(SECTIONS)}")
        pattern = _pattern(name, markers)
        if not pattern.search(text):
            raise ValueError(f"{path}: 'generated:{name}' has no matching END marker")
        body = SECTIONS[name]().rstrip("\n") + "\n"
        text = pattern.sub(_replacer(body), text)
    return text


def render_all(paths: Iterable[Path] = GENERATED_FILES) -> dict[Path, str]:
    """Every file's text, sections rewritten (ValueError: a section in none of the files)."""
    texts = {path: path.read_text() for path in paths}
    found = {name for text in texts.values() for name in sections_in(text)}
    missing = [name for name in SECTIONS if name not in found]
    if missing:
        raise ValueError(f"no file has the generated section(s) {missing}: add their markers")
    return {path: render(text, path) for path, text in texts.items()}


def _replacer(body: str) -> Callable[[re.Match[str]], str]:
    """A substitution keeping the markers (``body`` is literal text, not a regex template)."""
    return lambda match: match.group(1) + body + match.group(3)


def update(paths: Iterable[Path] = GENERATED_FILES) -> list[Path]:
    """Rewrite the generated sections of every file; the files that changed."""
    changed = []
    for path, new in render_all(paths).items():
        if new != path.read_text():
            path.write_text(new)
            changed.append(path)
    return changed


def command(args: argparse.Namespace) -> int:
    """``python -m lcab.report docs``: rewrite every generated section, saying which changed."""
    changed = update()
    for path in GENERATED_FILES:
        print(f"{path}: {'updated' if path in changed else 'already current'}")
    return 0
