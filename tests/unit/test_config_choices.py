"""A misspelt config option gets one line with what was probably meant — before torch loads.

``kernel=flash3`` cost 3-7 s (torch, a Hydra composition) and ended in Hydra's bare list of
options; a misspelt key got Hydra's advice to *add* it (``+mask.windw``), which no code reads; a
bad mask parameter was reported as the whole parameter dict. Each is now one line that names the
key, the value and what is valid.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from lcab.config import CONF_DIR
from lcab.config.choices import choice_problems, closest
from lcab.config.preflight import check_jobs
from lcab.masks.patterns import MASK_PATTERNS


def test_a_misspelt_kernel_names_the_one_meant():
    (line,) = choice_problems(["kernel=flash3"], CONF_DIR)
    assert line.startswith("kernel=flash3: no kernel named 'flash3'; did you mean kernel=fa3")
    assert line.endswith("sparse_vsa_triton, torch_varlen") and "\n" not in line
    assert closest("FlashAttention2", ["fa2", "fa3", "flex"])[0] == "fa2"
    assert closest("flash_attn_3", ["fa2", "fa3", "flex"])[0] == "fa3"
    assert closest("zzzz", ["fa2", "fa3"]) == []


@pytest.mark.parametrize(
    ("argv", "bad"),
    [
        (["-m", "kernel=ranges,flsh", "mask=causal"], ["kernel=flsh"]),
        (["+sweep=cpu_kernel"], ["sweep=cpu_kernel"]),
        (["kernel=fa3", "cp=ulysses,rings"], ["cp=rings"]),
        (["kernel=fa3,sparse", "cp=ulysses,ring", "mask=causal,document"], []),
        (["mask.window=5", "seqlen.values=[8192,32768]", "hydra.run.dir=x"], []),  # not groups
        (["kernel=glob(*)", "kernel=${oc.env:K}"], []),  # Hydra's own syntax: Hydra's to judge
        (["topology=2x8,4x8", "launcher=slurm_h100_example", "logger=null"], []),
    ],
)
def test_every_wrong_option_and_only_those(argv, bad):
    found = [line.split(":")[0] for line in choice_problems(argv, CONF_DIR)]
    assert found == bad


def test_the_command_line_answers_before_torch_loads():
    code = (
        "import sys\n"
        "from lcab import main\n"
        "sys.argv = ['lcab.main', 'kernel=flash3']\n"
        "try:\n"
        "    main.main()\n"
        "except SystemExit as done:\n"
        "    print(done.code, 'torch' in sys.modules)\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.stdout.split() == ["2", "False"], ran.stderr
    assert ran.stderr.startswith("lcab: kernel=flash3: no kernel named 'flash3'; did you mean")


def test_a_misspelt_key_is_not_told_to_be_added():
    (line,) = check_jobs(["mask=sliding_window", "mask.windw=512"], multirun=False)
    assert "+mask.windw" not in line and "To append" not in line
    assert "mask.windw=512: mask sliding_window has no key 'windw'" in line
    assert "did you mean mask.window?" in line


def _masks_with(param: str) -> str:
    """The mask patterns that take ``param``, from the mask registry (not from conf/)."""
    names = [n for n in MASK_PATTERNS.names() if param in MASK_PATTERNS.get(n).param_names()]
    return ", ".join(sorted(names))


def test_a_key_of_other_masks_names_them():
    """``mask.window`` on the default mask: which masks take a window, and how to pick one."""
    (line,) = check_jobs(["mask.window=-5"], multirun=False)
    takers = _masks_with("window")
    assert takers.count(",") == 2  # global_sliding_window, sliding_window, sliding_window_causal
    assert line.startswith(
        f"mask.window=-5: mask causal_document has no key 'window'; it is a setting of "
        f"mask={takers} (e.g. mask=sliding_window mask.window=-5); valid keys of mask "
        "causal_document: name, seed, doc_source,"
    )


def test_a_misspelt_key_is_looked_for_in_every_masks_keys():
    (line,) = check_jobs(["mask.windw=512"], multirun=False)  # the default mask has no window
    assert f"did you mean mask.window (a setting of mask={_masks_with('window')})?" in line


def test_a_bad_mask_parameter_names_its_key_value_and_rule():
    (line,) = check_jobs(["mask=sliding_window", "mask.window=-5"], multirun=False)
    assert line.endswith(
        "mask.window=-5 is invalid: must be >= 0 (mask sliding_window at seqlen 1024)"
    )
