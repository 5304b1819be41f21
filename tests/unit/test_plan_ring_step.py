"""The ring-step timer (launchers/plan_ring_step.py): its calls are the mask's blocks, its merge
is the softmax merge, and its planner column splits the planner's own cost of the rank. (Timing
needs a GPU; our side runs here with a plain-torch stand-in for the varlen kernel.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lcab.cp import STRATEGIES
from lcab.kernels import Problem
from lcab.masks import make_mask
from lcab.plan.hardware import load_profile
from lcab.plan.harness import LONGCA
from lcab.plan.model import CostModel
from lcab.plan.predict import mask_for, strategy_for
from lcab.plan.published import paper_cell
from lcab.plan.replay import replay
from plan_ring_step import (
    PARTS,
    correction,
    main,
    planner_parts,
    step_calls,
    time_forward,
    warm_up,
)

S = 512


@pytest.mark.parametrize("name", ["full_document", "causal_document", "causal"])
def test_each_step_call_attends_exactly_the_mask_pairs_of_its_two_shards(name):
    """Full masks: every query of a document attends its keys; causal masks: step 0 is causal
    within each sequence, other steps call with one half (queries or keys) of a zigzag shard —
    and either way the call's pairs are the mask's pairs between the two whole shards."""
    params = {"doc_source": "uniform", "min_doc_len": 9, "max_doc_len": 90}
    mask = make_mask(name, S, seed=2, **({} if name == "causal" else params))
    problem = Problem(S, S, 4, 2, 16, torch.bfloat16)
    plan = STRATEGIES.get("ring")({"balance": "zigzag"}, 4).plan(mask, problem, 4)
    layouts = list(plan.rank_layouts)
    dense = mask.to_dense().numpy()
    documents = 1 if mask.doc_lengths is None else len(mask.doc_lengths)
    halves = 0
    for rank in range(4):
        calls = step_calls(mask, layouts, rank)
        assert len(calls) == 4
        for t, call in enumerate(calls):
            mine, theirs = layouts[rank], layouts[(rank - t) % 4]
            assert len(call.cu_q) == len(call.cu_k) == documents + 1
            assert call.causal == (name != "full_document" and t == 0)
            q_ids = mine if call.q_half is None else mine[call.q_half.numpy()]
            k_ids = theirs if call.kv_half is None else theirs[call.kv_half.numpy()]
            halves += (call.q_half is not None) + (call.kv_half is not None)
            pairs = set()
            for i in range(len(call.cu_q) - 1):
                rows = q_ids[call.q_index[call.cu_q[i] : call.cu_q[i + 1]].numpy()]
                cols = k_ids[call.kv_index[call.cu_k[i] : call.cu_k[i + 1]].numpy()]
                pairs |= {
                    (int(a), int(b))
                    for x, a in enumerate(rows)
                    for y, b in enumerate(cols)
                    if not call.causal or y <= x  # causal within the sequence, in local order
                }
            ids_q, ids_k = mine[mine >= 0], theirs[theirs >= 0]
            sub = dense[np.ix_(ids_q, ids_k)]
            expected = {
                (int(ids_q[a]), int(ids_k[b])) for a, b in zip(*np.nonzero(sub), strict=True)
            }
            assert pairs == expected
            assert call.max_q == int(np.diff(call.cu_q.numpy()).max())
    # a causal ring of 4: each rank has 3 steps on other ranks' K/V, each with one half
    assert halves == (0 if name == "full_document" else 4 * 3)


def test_the_merge_of_two_partial_attentions_is_the_attention_over_all_keys():
    gen = torch.Generator().manual_seed(0)
    t, h, d = 6, 2, 8
    q, k, v = (torch.randn(t, h, d, generator=gen) for _ in range(3))

    def attend(keys: slice) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.einsum("thd,shd->hts", q, k[keys]) / d**0.5
        out = torch.einsum("hts,shd->thd", scores.softmax(-1), v[keys])
        return out, scores.logsumexp(-1)  # LSE [h, t], as the published code holds it

    (o1, l1), (o2, l2), (whole, _) = attend(slice(0, 4)), attend(slice(4, 9)), attend(slice(0, 9))
    lse = torch.logaddexp(l1, l2)
    merged = correction(correction(torch.zeros_like(q), o1, lse, l1), o2, lse, l2)
    assert torch.allclose(merged, whole, atol=1e-5)


@pytest.mark.parametrize("name", ["full_document", "causal_document"])
def test_the_timer_runs_every_part_and_hands_the_kernel_each_step_s_sequences(name):
    mask = make_mask(name, S, seed=1, doc_source="uniform", min_doc_len=30, max_doc_len=200)
    problem = Problem(S, S, 4, 2, 16, torch.bfloat16)
    plan = STRATEGIES.get("ring")({"balance": "zigzag"}, 4).plan(mask, problem, 4)
    calls = step_calls(mask, list(plan.rank_layouts), 1)  # causal: own, kv half, q half, q half
    seen = []

    def stand_in(q, k, v, cu_q, cu_k, max_q, max_k, causal):
        """Plain-torch stand-in of the varlen contract: one block per sequence."""
        seen.append((cu_q, cu_k, max_q, max_k, causal, k.shape[1]))
        out = torch.zeros_like(q)
        for i in range(len(cu_q) - 1):
            rows, cols = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            if rows.stop > rows.start and cols.stop > cols.start:
                qi, ki, vi = (x.transpose(0, 1) for x in (q[rows], k[cols], v[cols]))
                ki, vi = (x.repeat_interleave(q.shape[1] // k.shape[1], 0) for x in (ki, vi))
                att = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=causal)
                out[rows] = att.transpose(0, 1)
        return out, None

    shape = (plan.shard_len, 4, 2, 16)

    def broken_compile(*args):
        raise RuntimeError("no compiler")

    assert warm_up(calls, shape, stand_in, 4, "cpu", broken_compile) is correction
    seen.clear()
    spent = time_forward(calls, shape, stand_in, 4, "cpu")
    assert set(spent) == set(PARTS)
    assert all(ms > 0 for part, ms in spent.items() if part != "extract half")
    assert (spent["extract half"] > 0) == (name == "causal_document")
    expected = [(c.cu_q, c.cu_k, c.max_q, c.max_k, c.causal, 4) for c in calls]  # K/V to 4 heads
    assert seen == expected
    assert [c.causal for c in calls] == [name == "causal_document", False, False, False]


@pytest.mark.parametrize("name", ["full_document", "causal"])
def test_the_planner_column_splits_the_rank_s_own_forward_cost(name):
    hardware = load_profile("h100_nvlink_ib")
    cell = paper_cell(name, "ring", 8, 0)
    mask = mask_for(cell)
    parts, layouts = planner_parts(mask, (name, 8, 0), 3, hardware, "fa3")
    assert len(layouts) == 8 and parts["pad lse"] == 0
    assert all(ms > 0 for p, ms in parts.items() if p not in ("pad lse", "extract half"))
    # causal, rank 3 of 8: 4 steps on later ranks extract half of q (read + write), 3 on earlier
    # ones half of K and V (2 x read + write); 8192 tokens, 64 query and 8 KV heads of 128, bf16
    half = 8192 // 2
    by_hand = 4 * 2 * half * 64 * 128 * 2 + 3 * 4 * half * 8 * 128 * 2
    expected = 0.0 if name == "full_document" else 1e3 * by_hand / (hardware.memory_gbps * 1e9)
    assert parts["extract half"] == pytest.approx(expected)
    # the same rank costed stage by stage (compute only: a ring step's transfer runs beside it)
    strategy = strategy_for(cell)
    replayed = replay(strategy, mask, cell.problem(), 8, harness=LONGCA)
    model = CostModel(hardware, "fa3", 8)
    stages = [s for w in replayed.passes["fwd"][3] for s in w.stages]
    assert sum(parts.values()) == pytest.approx(
        1e3 * sum(model.stage_s(s, False)[1] for s in stages)
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the messages without a GPU")
def test_bad_input_and_a_missing_gpu_exit_2_naming_the_problem(capsys):
    assert main(["--cp", "12", "--rank", "12", "--sample", "20", "--hardware", "h200"]) == 2
    err = capsys.readouterr().err
    assert "--cp=12" in err and "--rank=12" in err and "--sample=20" in err
    assert "'h200' is no profile; valid: auto, cpu_gloo_local, h100_nvlink_ib" in err
    assert "no CUDA device" in err
    with pytest.raises(SystemExit):
        main(["--mask", "sliding_window"])  # argparse names the valid choices
    assert "full_document" in capsys.readouterr().err
