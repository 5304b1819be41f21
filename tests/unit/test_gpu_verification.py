"""The GPU verification table renders exactly what the GPU run's lines say (no GPU needed)."""

from __future__ import annotations

import json

import pytest

from lcab.masks import list_masks
from lcab.report.__main__ import main
from lcab.report.gpu_verification import read_verification, verification_markdown

ENV = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0", "python": "3.12"}


def line(kernel, mask, pass_, verdict, **more):
    return {"kernel": kernel, "mask": mask, "pass": pass_, "verdict": verdict, **ENV, **more}


def test_cells_versions_and_failures_come_from_the_lines(tmp_path):
    rows = [
        line("fa3", "causal", "fwd", "verified", package="flash_attn_3", package_version="3.0.0"),
        line("fa3", "causal", "bwd", "failed", error="RuntimeError: boom"),
        line("fa3", "full", "fwd", "unsupported", reason="no"),
        line("sdpa", "causal", "fwd", "verified"),
        line("fa4", "causal", "fwd", "unsupported", reason="needs package 'x', not installed"),
    ]
    path = tmp_path / "verification.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    table = verification_markdown(read_verification(path))
    assert table.startswith("GPU run: NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, CUDA 13.0")
    assert "| kernel | `causal` | `full` |" in table
    assert "| `fa3` (flash_attn_3 3.0.0) | verified / FAILED | – / · |" in table
    assert "| `sdpa` | verified / · | · / · |" in table
    assert "- `fa3` × `causal` bwd: RuntimeError: boom" in table
    # fa3's "no" is a declared limit, fa4's a missing package: only fa4 is named as such
    assert "Not installed on this machine (their `–` judges nothing): `fa4`." in table
    # every registered mask but the two recorded ones is named as never run
    unrecorded = [m for m in list_masks() if m not in ("causal", "full")]
    assert f"Masks with no record (no case ran): `{'`, `'.join(unrecorded)}`." in table


def test_a_bad_file_exits_2_naming_the_line(tmp_path, capsys):
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps({"kernel": "fa3"}) + "\n")
    assert main(["gpu-table", str(path)]) == 2
    assert f"{path}:1: missing mask, pass, verdict" in capsys.readouterr().err
    assert main(["gpu-table", str(tmp_path / "none.jsonl")]) == 2


@pytest.mark.parametrize("text", ["", "\n"])
def test_no_lines_say_so(tmp_path, text):
    path = tmp_path / "v.jsonl"
    path.write_text(text)
    assert verification_markdown(read_verification(path)) == "No GPU verification records."
