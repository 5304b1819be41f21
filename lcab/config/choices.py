"""A config group's option that does not exist, said in one line with the nearest ones.

Groups are folders of ``conf/`` and options its files, so a misspelt option (``kernel=flash3``)
is found from the command line alone, before torch and Hydra load (3-7 s), and answered with the
closest names. The pre-flight words Hydra's own "Could not find" the same way (`choice_line`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

SWEEP_SYNTAX = set("()[]{}*$'\" ")
"""Characters of Hydra's sweep functions, globs and interpolations: such a value is Hydra's."""


def options(group: str, conf_dir: Path) -> list[str]:
    """The options of ``group``: its folder's YAML files (empty: not a group)."""
    return sorted(path.stem for path in (conf_dir / group).glob("*.yaml"))


def _spelling(name: str) -> str:
    """A name as people spell it loosely: case, ``-``/``_`` and "flash attention" → ``fa``."""
    name = re.sub(r"flash[-_]?(attn|attention)?[-_]?", "fa", name.lower())
    return name.replace("-", "").replace("_", "")


def closest(name: str, candidates: Sequence[str]) -> list[str]:
    """The candidates ``name`` was most probably meant to be (best first; none if none is near).

    A candidate spelt the same way loosely comes first (``flash3``, ``FlashAttention3`` and
    ``flash_attn_3`` all mean ``fa3``), then ``difflib``'s closest names.
    """
    same = [c for c in candidates if _spelling(c) == _spelling(name)]
    near = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return list(dict.fromkeys(same + near))[:3]


def choice_line(group: str, choice: str, valid: Sequence[str]) -> str:
    """``group=choice: no such group; did you mean X? valid: ...`` (one line)."""
    near = closest(choice, valid)
    hint = f"did you mean {' or '.join(f'{group}={n}' for n in near)}? " if near else ""
    return f"{group}={choice}: no {group} named {choice!r}; {hint}valid: {', '.join(valid)}"


def choice_problems(argv: Sequence[str], conf_dir: Path) -> list[str]:
    """One line per group option of ``argv`` that ``conf_dir`` has no file for.

    Only plain options of top-level groups are judged (``kernel=fa3,sparse`` is two).
    """
    problems = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+~")
        if not sep or not group or "." in group or "/" in group or SWEEP_SYNTAX & set(value):
            continue
        valid = options(group, conf_dir)
        if not valid:
            continue
        for choice in value.split(","):
            if choice and choice not in valid and choice != "null":
                problems.append(choice_line(group, choice, valid))
    return problems


def option_keys(group: str, conf_dir: Path) -> dict[str, list[str]]:
    """The keys each option of ``group`` takes: its schema's and its own file's.

    The schemas are those `lcab.config.register_configs` put in Hydra's ConfigStore.
    """
    import yaml
    from hydra.core.config_store import ConfigStore

    out = {}
    for option in options(group, conf_dir):
        data = yaml.safe_load((conf_dir / group / f"{option}.yaml").read_text()) or {}
        keys = []
        for entry in data.get("defaults") or []:
            if isinstance(entry, str) and entry.startswith("/schema/"):
                schema = entry[1:].split("@")[0]
                keys += [str(k) for k in ConfigStore.instance().load(f"{schema}.yaml").node]
        out[option] = list(dict.fromkeys([*keys, *(k for k in data if k != "defaults")]))
    return out
