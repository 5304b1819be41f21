"""Every shell command of README.md and of the guides runs as written; every guide is linked.

Each command is taken from the ``bash`` blocks of README.md and of the guides beside the code
(``lcab/*/README.md``) and checked by what it calls, without
running long benchmarks: ``python -m lcab.main`` runs for real with ``dry_run=true`` (the same
parsing, config composition and pre-flight checks as a run, nothing executed); the planner's
Hydra commands compose every cell of their sweep; argparse entry points (``lcab.report``,
``lcab.plan --published``, ``lcab.sweep``, ``lcab.perf``, pytest, the lab tools
``python launchers/NAME.py``) get ``--help`` after the
command's own arguments, which must exit 0 and list every flag the command uses; shell scripts
must exist and parse (``bash -n``) and know the subcommand given; ``pip install "lcab[x]"`` must
name extras of pyproject.toml; ``python -c`` code must compile; shell plumbing is checked for its
form (``export NAME=...``, ``kill %N``, ``source`` of a file a launcher script writes, a command
under ``/usr/bin/time``). A command nothing here can check fails the test, so a new kind of
command needs a checker before it goes into a guide. A command too slow for CI would be listed
in `TOO_SLOW` with its reason, printed when the test passes it by; none is today.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from lcab.config import CONF_DIR, register_configs
from lcab.plan.hardware import load_profile
from tests.helpers.cli import run_with_stacks

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 200
TIMEOUT_S = 300
SWEEP_PLACEHOLDER = "outputs/sweeps/<date>/<time>_<id>"


def readme_commands(text: str) -> list[str]:
    """The commands of ``text``'s ``bash`` blocks: continuations joined, ``&&`` chains split.

    A quoted string may span lines (``python -c '...'``); a trailing ``&`` (a background job) is
    dropped.
    """
    commands = []
    for indent, block in re.findall(r"^([ \t]*)```bash\n(.*?)^[ \t]*```", text, re.DOTALL | re.M):
        lines = [line.removeprefix(indent) for line in block.splitlines()]  # a list item's block
        pending = ""
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # a quote still open: the command goes on on the next line
                continue
            pending = ""
            if words[-1:] == ["&"]:
                words = words[:-1]
            while words:
                end = words.index("&&") if "&&" in words else len(words)
                commands.append(shlex.join(words[:end]))
                words = words[end + 1 :]
        if pending:
            raise ValueError(f"unclosed quote in a bash block: {pending[:200]!r}")
    return commands


COMMANDS = readme_commands(README.read_text())
GUIDES = sorted((ROOT / "lcab").glob("*/README.md"))
GUIDE_COMMANDS = [
    (guide.relative_to(ROOT).as_posix(), command)
    for guide in GUIDES
    for command in readme_commands(guide.read_text())
]

#: Guide or README commands too slow for a CI run, with the reason (printed when passed by).
TOO_SLOW: dict[str, str] = {}

#: Commands that need a visible GPU (the pre-flight refuses problem.device=cuda without one):
#: checked where one is, passed by with this reason printed elsewhere.
NEEDS_GPU = {
    "python -m lcab.main cp=ring topology=local4 topology.backend=gloo problem.device=cuda "
    "kernel=fa4": "CP ranks sharing one GPU need that GPU",
}

#: Commands (module, subcommand) whose argument is a file a GPU run writes: checked on the
#: committed file of that kind.
COMMITTED_INPUT = {
    ("lcab.report", "gpu-table"): ROOT / "notebooks" / "data" / "gpu_verification.jsonl",
}


def _words(command: str, sweep_dir: Path) -> tuple[dict[str, str], list[str]]:
    """The command's environment assignments and words, placeholders made concrete."""
    command = command.replace(SWEEP_PLACEHOLDER, str(sweep_dir))
    command = re.sub(r"<[a-z_]+>", "placeholder", command)
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; one that hangs fails with its threads' stacks."""
    return run_with_stacks(argv, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=TIMEOUT_S)


def _flags(args: list[str]) -> list[str]:
    """The options a command uses (``--out``, ``-n``), without their values."""
    return [a.split("=")[0] for a in args if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", a)]


def _check_help(module: str, args: list[str], env: dict[str, str]) -> None:
    """``python -m module args --help`` (or ``python FILE.py`` for a file) exits 0 and documents
    every flag ``args`` uses."""
    program = [module] if module.endswith(".py") else ["-m", module]
    result = _run([sys.executable, *program, *args, "--help"], env)
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in _flags(args):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", result.stdout), (
            f"{module} --help does not list {flag}"
        )


def _check_main(args: list[str], env: dict[str, str]) -> None:
    """The real CLI with ``dry_run=true``: composes, validates and plans every job.

    On a GPU profile every job's kernel has figures of its own: an example that left the kernel
    to the default (``ranges``, a CPU kernel) would have 64 H100s time it, which the dry run
    says by costing it at the profile's default rate.
    """
    if not any(a.startswith("dry_run=") for a in args):
        args = [*args, "dry_run=true"]
    result = _run([sys.executable, "-m", "lcab.main", *args], env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "job(s)" in result.stdout, result.stdout[-2000:]
    said = " ".join(result.stdout.split())  # footnotes, whatever their line breaks
    for kernel, profile in re.findall(_DEFAULT_RATE, said):
        assert load_profile(profile).device != "cuda", f"{kernel} on {profile}: name a GPU kernel"


_DEFAULT_RATE = r"(\S+) has no figures in hardware profile (\S+): costed at the profile's default"
"""`lcab.plan.hardware.Hardware.rate_origin`'s words for a kernel costed at another's rate."""


def _cells(overrides: list[str]) -> list[list[str]]:
    """The cartesian product of a multirun's overrides, as Hydra's basic sweeper expands it."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for override in parsed:
        key = override.get_key_element()
        values = (
            list(override.sweep_string_iterator())
            if override.is_sweep_override()
            else [override.get_value_element_as_str()]
        )
        choices.append([f"{key}={value}" for value in values])
    return [list(cell) for cell in itertools.product(*choices)]


def _check_plan_hydra(args: list[str]) -> None:
    """Every cell of a planner command composes against ``conf/plan.yaml``."""
    overrides = [a for a in args if a != "-m"]
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for cell in _cells(overrides):
                compose("plan", overrides=cell)  # an unknown option or key raises here
    finally:
        GlobalHydra.instance().clear()


def _check_bash(words: list[str], env: dict[str, str]) -> None:
    """The script exists, parses, and knows the subcommand and variables the command gives."""
    script = ROOT / words[1]
    assert script.is_file(), f"{words[1]} does not exist"
    assert _run(["bash", "-n", str(script)]).returncode == 0, f"{words[1]} does not parse"
    text = script.read_text()
    for subcommand in words[2:3]:
        if not subcommand.startswith(("/", "placeholder")) and "/" not in subcommand:
            assert re.search(rf"\b{re.escape(subcommand)}\)", text), (
                f"{words[1]} has no '{subcommand})' case"
            )
    for variable in env:
        assert variable in text, f"{words[1]} does not read {variable}"


def _check_pip(words: list[str]) -> None:
    """``pip install "lcab[extra,...]"`` names extras that pyproject.toml defines."""
    assert words[1] == "install", words
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    requirements = [w for w in words[2:] if not w.startswith("-")]
    assert requirements, words
    for requirement in requirements:
        match = re.fullmatch(r"lcab\[([\w,-]+)\]", requirement)
        assert match, f"pip install of {requirement!r}: only lcab's extras are checked"
        for extra in match.group(1).split(","):
            assert extra in extras, f"lcab has no extra {extra!r}; it has {sorted(extras)}"


def _check_source(words: list[str]) -> None:
    """``source FILE``: a file one of the launcher scripts writes (``$D/env`` of slurm_local)."""
    assert len(words) == 2, words
    path = Path(words[1])
    scripts = [p.read_text() for p in (ROOT / "launchers").glob("*.sh")]
    assert any(str(path.parent) in text and f"/{path.name}" in text for text in scripts), (
        f"no launchers/*.sh writes {path}"
    )


def _without_time(words: list[str]) -> list[str]:
    """The command under ``/usr/bin/time [-f FORMAT | -p]``."""
    rest = words[1:]
    while rest and rest[0] in ("-f", "-p"):
        rest = rest[2:] if rest[0] == "-f" else rest[1:]
    assert rest, words
    return rest


def check_command(command: str, sweep_dir: Path) -> None:
    """Check one README command by what it calls (see the module docstring)."""
    env, words = _words(command, sweep_dir)
    if words[0] in ("/usr/bin/time", "time"):
        words = _without_time(words)
    program = words[0]
    if program == "export":  # NAME=value words (a value may hold a $(...) split into words)
        names = [w.split("=", 1)[0] for w in words[1:] if re.match(r"[A-Za-z_]\w*=", w)]
        assert names and all(re.fullmatch(r"[A-Z_][A-Z0-9_]*", n) for n in names), words
    elif program == "kill":  # of the block's background jobs, by job spec
        assert words[1:] and all(re.fullmatch(r"%\d+", w) for w in words[1:]), words
    elif program == "source":
        _check_source(words)
    elif program in ("python", ".venv/bin/python") and words[1] == "-c":
        compile(words[2], "<bash block>", "exec")  # a syntax error raises here
    elif program == "bash":
        _check_bash(words, env)
    elif program == "pip":
        _check_pip(words)
    elif program == "wandb":
        wandb = Path(sys.executable).parent / "wandb"
        result = _run([str(wandb), *words[1:2], "--help"], env)
        assert result.returncode == 0, result.stderr[-2000:]
    elif program in ("python", ".venv/bin/python") and re.fullmatch(r"launchers/\w+\.py", words[1]):
        _check_help(words[1], words[2:], env)
    elif program in ("python", ".venv/bin/python") and words[1] == "-m":
        module, args = words[2], words[3:]
        committed = COMMITTED_INPUT.get((module, args[0] if args else ""))
        if committed is not None:
            result = _run([sys.executable, "-m", module, args[0], str(committed)], env)
            assert result.returncode == 0 and result.stdout.strip(), result.stderr[-2000:]
        elif module == "lcab.main":
            _check_main(args, env)
        elif module == "lcab.plan" and not any(a.startswith("--") for a in args):
            _check_plan_hydra(args)
        else:
            _check_help(module, args, env)
    else:
        pytest.fail(f"no checker for README command {command!r}: add one to this test")


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs_as_written(command, tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    check_command(command, sweep_dir)


@pytest.mark.parametrize(
    ("guide", "command"), GUIDE_COMMANDS, ids=[f"{g}: {c[:80]}" for g, c in GUIDE_COMMANDS]
)
def test_guide_command_runs_as_written(guide, command, tmp_path):
    if command in TOO_SLOW:
        print(f"{guide}: not run here ({TOO_SLOW[command]}): {command}")
        return
    if command in NEEDS_GPU:
        import torch

        if not torch.cuda.is_available():
            print(f"{guide}: not run here (no GPU; {NEEDS_GPU[command]}): {command}")
            return
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    check_command(command, sweep_dir)


def test_every_guide_with_a_bash_block_is_read():
    # the extraction itself: multi-line quotes, background jobs and plumbing of the guides
    with_blocks = {g.relative_to(ROOT).as_posix() for g in GUIDES if "```bash" in g.read_text()}
    assert with_blocks == {guide for guide, _ in GUIDE_COMMANDS}
    assert "lcab/launch/README.md" in with_blocks
    text = "* item:\n  ```bash\n  python -c 'a = 1\n  print(a)' &\n  kill %1\n  ```\n"
    assert readme_commands(text) == ["python -c 'a = 1\nprint(a)'", "kill %1"]
    assert set(NEEDS_GPU) | set(TOO_SLOW) <= {command for _, command in GUIDE_COMMANDS}
    with pytest.raises(ValueError, match="unclosed quote"):
        readme_commands("```bash\npython -c 'a = 1\n```\n")


def test_readme_has_the_commands_users_need():
    # the extraction itself: the Quick start's two commands, and each kind of checker in use
    assert COMMANDS[:4] == [
        "bash launchers/setup.sh",
        ".venv/bin/python -m lcab.main",
        "bash launchers/setup.sh",
        ".venv/bin/python -m pytest -n 2",
    ]
    design_card = "python -m lcab.main -m kernel=fa3,sparse cp=ulysses,ring mask=causal,document"
    assert design_card in COMMANDS
    assert any(c.startswith("python -m lcab.plan -m ") for c in COMMANDS)
    assert any(c.startswith("python -m lcab.main -m launcher=slurm") for c in COMMANDS)


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


@pytest.mark.parametrize(
    ("command", "error"),
    [
        ("python -m lcab.main kernel=no_such_kernel", AssertionError),
        ("python -m lcab.main -m cp=ring mask.no_such_field=3", AssertionError),
        ("python -m lcab.report build x --no-such-flag", AssertionError),
        ("python -m lcab.perf no_such_topic", AssertionError),
        ("python -m lcab.plan -m cp=ring,no_such_cp", HydraException),
        ("python -m lcab.plan recommend=true no_such_key=1", HydraException),
        ("bash launchers/no_such_script.sh", AssertionError),
        ("bash launchers/slurm_local.sh start", AssertionError),
        ('pip install "lcab[no_such_extra]"', AssertionError),
        ("python -c 'def broken(:'", SyntaxError),
        ("export lower=1", AssertionError),
        ("kill 1234", AssertionError),
        ("source /tmp/no-such-folder/env", AssertionError),
        ("/usr/bin/time -f %es python -m lcab.main kernel=no_such_kernel", AssertionError),
    ],
)
def test_a_wrong_command_fails_its_check(command, error, tmp_path):
    # each checker can fail: a misspelled option, key, flag, topic, script, case and extra
    with pytest.raises(error):
        check_command(command, tmp_path)


def test_a_command_that_hangs_fails_with_its_stacks_and_leaves_nothing(tmp_path) -> None:
    # a forked child holding the pipes, as the dry run's pool workers did
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n    time.sleep(600)\n"
        "def waits_here():\n    time.sleep(600)\nwaits_here()\n"
    )
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"(?s)did not end within 2 s.*waits_here"):
        run_with_stacks([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), timeout=2)
    assert time.monotonic() - start < 60  # not held until the forked child's sleep ends
