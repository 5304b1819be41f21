"""``--help`` of lcab's Hydra apps in well under a second, without torch.

Hydra's own ``--help`` fills every placeholder of the help template whether the template uses it
or not; listing the config groups builds a config repository per group (about 150 with the
``schema/*`` ones) and deep-copies the stored configs each time: 5-8 s on 2 cores. lcab's
template (``conf/hydra/help/lcab.yaml``) already carries the groups and options, generated from
``conf/`` (``python -m lcab.report docs``; ``tests/unit/test_readme_help.py`` holds that list
to the groups and options Hydra's own repository sees), and uses only ``$CONFIG``, the composed
config. That one needs the registered schemas, which are generated from the kernel, mask and
strategy registries and so load torch: it is composed once per (config, overrides) and kept in
``$LCAB_CACHE_DIR/help`` (else ``~/.cache/lcab/help``) under a key that covers every ``conf/``
file, every lcab source file and Hydra's and OmegaConf's versions, so an edit anywhere composes
it again. The printed text is Hydra's, character for character (a test compares the two).

Only ``--help``/``-h`` with overrides (and ``-m``) take this path; any other Hydra flag
(``--resolve``, ``--config-name``, ...) or a template that needs another placeholder is left to
Hydra's own help.
"""

from __future__ import annotations

import hashlib
import os
import string
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import hydra
import omegaconf
import yaml

from lcab.config import CONF_DIR

HELP_FLAGS = ("--help", "-h")
#: Flags this path understands besides the help flags: Hydra ignores -m for ``--help``.
_HARMLESS = ("-m", "--multirun")
HELP_TEMPLATE = CONF_DIR / "hydra" / "help" / "lcab.yaml"
_GROUPS_HEADING = "== Config groups"
_LCAB = Path(__file__).resolve().parents[1]


def wants_help(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for the app's help: ``--help`` or ``-h`` anywhere, as Hydra reads."""
    return any(a in HELP_FLAGS for a in argv)


def cache_dir() -> Path:
    """``$LCAB_CACHE_DIR/help``, else ``~/.cache/lcab/help``."""
    root = os.environ.get("LCAB_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "lcab") / "help"


def template_text() -> str:
    """The ``template`` of lcab's Hydra help config (``conf/hydra/help/lcab.yaml``)."""
    return str(yaml.safe_load(HELP_TEMPLATE.read_text())["template"])


def fingerprint() -> str:
    """A digest of everything the composed config can depend on.

    Every file of ``conf/`` and every ``.py`` file of lcab (the schemas are generated from the
    registries, which any module may extend), and the versions of Hydra and OmegaConf.
    """
    digest = hashlib.sha256(f"{hydra.__version__} {omegaconf.__version__}".encode())
    for base, pattern in ((CONF_DIR, "*.yaml"), (_LCAB, "*.py")):
        for path in sorted(base.rglob(pattern)):
            digest.update(f"{base.name}/{path.relative_to(base)}".encode())
            digest.update(b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def compose_yaml(config_name: str, overrides: Sequence[str]) -> str:
    """The composed config as Hydra's help prints it (``$CONFIG``: the ``hydra`` node left out).

    Raises:
        hydra.errors.HydraException, omegaconf.errors.OmegaConfBaseException: a bad override.

    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from lcab.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_yaml(cfg)


def composed_yaml(config_name: str, overrides: Sequence[str]) -> str:
    """`compose_yaml`, from the cache when it holds this (config, overrides, sources)."""
    key = hashlib.sha256("\n".join([fingerprint(), config_name, *overrides]).encode()).hexdigest()[
        :32
    ]
    path = cache_dir() / f"{config_name}-{key}.yaml"
    try:
        return path.read_text()
    except OSError:
        pass
    text = compose_yaml(config_name, overrides)
    try:  # a read-only or full home only costs the next --help the composition again
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as fh:
            fh.write(text)
        os.replace(fh.name, path)
    except OSError:
        pass
    return text


def help_text(config_name: str, overrides: Sequence[str], intro: str | None = None) -> str:
    """The app's help: lcab's template with the composed config; ``intro`` replaces its opening.

    ``intro`` is the text above the config groups (the planner's own description and examples).
    """
    template = template_text()
    if intro is not None:
        template = intro.rstrip("\n") + "\n\n" + template[template.index(_GROUPS_HEADING) :]
    return string.Template(template).substitute(CONFIG=composed_yaml(config_name, overrides))


def fast_help_applies(argv: Sequence[str]) -> bool:
    """Whether this path can answer ``argv`` as Hydra would (see the module docstring)."""
    if not wants_help(argv):
        return False
    flags = [a for a in argv if a.startswith("-") and a not in HELP_FLAGS + _HARMLESS]
    if flags:
        return False
    names = {
        m.group("named") or m.group("braced")
        for m in string.Template.pattern.finditer(template_text())
        if m.group("named") or m.group("braced")
    }
    return names <= {"CONFIG"}


def print_help(config_name: str, argv: Sequence[str], intro: str | None = None) -> int:
    """Print the help for ``argv`` (overrides apply to the config shown); the exit code.

    A bad override ends in one line and exit code 2, as on a run.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = [a for a in argv if not a.startswith("-")]
    try:
        text = help_text(config_name, overrides, intro)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"lcab: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(text)
    return 0
