"""The support matrix's evidence marks: contract-tested vs GPU-verified, from committed data."""

from __future__ import annotations

import json

from lcab.kernels import get_kernel
from lcab.report import support
from lcab.report.support import Verdict, evidence, gpu_verdicts


def test_gpu_marks_come_only_from_the_committed_verification_file(tmp_path):
    path = tmp_path / "gpu_verification.jsonl"
    rows = [
        {"kernel": "fa3", "mask": "causal", "pass": "fwd", "verdict": "verified"},
        {"kernel": "fa3", "mask": "causal", "pass": "bwd", "verdict": "failed", "error": "x"},
        {"kernel": "fa3", "mask": "full", "pass": "fwd", "verdict": "verified"},
        {"kernel": "fa3", "mask": "full", "pass": "bwd", "verdict": "verified"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    gpu = gpu_verdicts(path)
    fa3, both = get_kernel("fa3"), Verdict(("fwd", "bwd"), ())
    assert evidence(fa3, "causal", both, gpu) == "G/G!"
    assert evidence(fa3, "full", both, gpu) == "G"
    assert evidence(fa3, "causal_document", both, gpu) == "c"  # contract-tested only
    assert evidence(fa3, "causal", Verdict((), ("x",)), gpu) == ""  # unsupported: no mark
    assert evidence(get_kernel("ranges"), "causal", both, gpu) == ""  # CPU: run by the suite
    assert gpu_verdicts(tmp_path / "absent.jsonl") == {}


def test_without_a_committed_run_the_matrix_says_no_cell_is_gpu_verified(monkeypatch, tmp_path):
    monkeypatch.setattr(support, "VERIFICATION_FILE", tmp_path / "none.jsonl")
    monkeypatch.setattr(support, "gpu_verdicts", lambda path=None: {})
    text = support.kernel_matrix_markdown()
    assert "GPU-verified: none yet" in text
    fa3_row = next(line for line in text.splitlines() if line.startswith("| `fa3`"))
    assert " G" not in fa3_row and "✓ c" in fa3_row
