"""The copy probe (launchers/plan_copies.py): it runs the baselines' copies faithfully and costs
them as the planner."""

from __future__ import annotations

import pytest
import torch

from lcab.plan.harness import LONGCA, Copies, Passes
from plan_copies import PROBED_PASSES, StepShape, main, merge_lse, pad, pad_lse, probe, unpad


def test_probed_passes_are_the_harness_ring_step_and_the_correction_comes_after_the_ring():
    shape = StepShape(tokens=96, valid=80, heads_q=8, heads_kv=2, head_dim=16)
    elements = shape.elements()
    probed = Copies()
    for copies in PROBED_PASSES.values():
        probed = probed.plus(copies)
    harness = LONGCA.call_passes("ring", bwd=False)
    assert probed.bytes(elements, 2, 4) == harness.bytes(elements, 2, 4)
    merge = LONGCA.merge_passes(bwd=False)
    assert merge is not None and LONGCA.merge_passes(bwd=True) is None
    correction = Copies(Passes(q=(3, 0)))  # read out, read step, write out
    assert merge[0].bytes(elements, 2, 4) == correction.bytes(elements, 2, 4)


def test_the_copies_do_what_the_baselines_functions_do():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(10, 3, 4, generator=gen)
    index = torch.tensor([0, 2, 3, 7])
    assert torch.equal(unpad(x, index), x[index])
    padded = pad(x[:4], index, 10)
    assert torch.equal(padded[index], x[:4])
    rest = torch.ones(10, dtype=torch.bool)
    rest[index] = False
    assert not padded[rest].any()
    lse = torch.randn(3, 4, generator=gen)
    padded_lse = pad_lse(lse, index, 10)
    assert torch.equal(padded_lse[:, index], lse) and torch.isneginf(padded_lse[:, rest]).all()
    a, b = torch.randn(3, 10, generator=gen), torch.randn(3, 10, generator=gen)
    expected = torch.logaddexp(a, b)
    assert torch.allclose(merge_lse(a, b), expected) and torch.allclose(a, expected)


def test_the_command_prints_measured_and_planner_times(capsys):
    assert main(["--tokens", "256", "--valid", "200", "--repeats", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == ["unpad", "unpad", "pad", "pad", "merge"]
    assert lines[-1].startswith("total")
    assert main(["--tokens", "256", "--valid", "300"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a missing GPU")
def test_cuda_without_a_gpu_exits_2(capsys):
    assert main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_gathers_and_scatters_are_modelled_at_their_own_efficiency():
    shape = StepShape(tokens=64, valid=48, heads_q=4, heads_kv=2, head_dim=8)
    full = {r[0]: r[3] for r in probe(shape, "cpu", 100.0, repeats=1)}
    slow = {
        r[0]: r[3]
        for r in probe(
            shape, "cpu", 100.0, repeats=1, gather_efficiency=0.5, scatter_efficiency=0.25
        )
    }
    assert slow["unpad q"] == pytest.approx(2 * full["unpad q"])  # all gather
    assert slow["unpad k, v"] == pytest.approx(2 * full["unpad k, v"])
    # pad out: a zero-fill of all 64 rows (full rate), then a scatter of 48 (a read and a
    # write of each) at a quarter of the rate, by hand
    row = 4 * 8 * 2  # bytes of one bf16 query row
    assert slow["pad out"] == pytest.approx(1e3 * (64 * row + 4 * 48 * row * 2) / 100e9)
