"""The empty-block probe (launchers/plan_empty_blocks.py): its fit turns call times into the
profile's SM-µs per empty block."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from plan_empty_blocks import EmptyBlockShape, main, us_per_block, varlen_call


def test_the_slope_is_spread_over_the_added_blocks_and_multiplied_by_the_multiprocessors():
    # 64 blocks per empty sequence, 4 multiprocessors: each added sequence costing 0.032 ms is
    # 32 µs of wall time over 64 blocks on 4 SMs, i.e. 2 SM-µs per block (hand-computed).
    ms = [1.0 + 0.032 * n for n in (0, 10, 40)]
    assert us_per_block([0, 10, 40], ms, blocks_per_empty=64, multiprocessors=4) == pytest.approx(2)


def test_blocks_per_sequence_round_up_to_whole_blocks():
    assert EmptyBlockShape(tokens=8192).blocks_per_sequence(128) == 64
    assert EmptyBlockShape(tokens=8193).blocks_per_sequence(128) == 65


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a missing GPU")
def test_without_a_gpu_the_command_exits_2(capsys):
    assert main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_flash_call_passes_one_sequence_list_for_queries_and_keys(monkeypatch):
    """Our side of the FA2/FA3 call (a stand-in records it): the same cu_seqlens and longest
    length for queries and keys, the 1/sqrt(d) scale, causal as asked, grouped K/V heads kept."""
    seen = {}

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        seen.update(cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, **kwargs)
        return q, None

    monkeypatch.setitem(
        sys.modules,
        "flash_attn_interface",
        types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func),
    )
    call, gqa = varlen_call("fa3")
    q, k = torch.zeros(10, 8, 64), torch.zeros(10, 2, 64)
    cu = torch.tensor([0, 10, 10, 10], dtype=torch.int32)
    call(q, k, k, cu, cu, 10, 10, True)
    assert gqa and seen["cu_q"] is cu and seen["cu_k"] is cu
    assert (seen["max_q"], seen["max_k"], seen["causal"]) == (10, 10, True)
    assert seen["softmax_scale"] == pytest.approx(1 / 8)
