"""The one-GPU CP step (`tests.gpu.cp_shared`) and its rows in the verification table, on CPU.

The step's cell list must cover every strategy (USP and LoongTrain also at 4 ranks) × the three
masks × every CUDA kernel; its dry run must sort cells as a GPU machine would (a ring needs an
LSE: SDPA is refused; FA4 runs when installed); the same machinery run on CPU ranks, every
transfer staged, must verify the portable kernel against fp64 with the plan's bytes; and CP rows
must stay out of the kernel table (the support matrix's marks) while getting a table of theirs.
"""

from __future__ import annotations

import json

import pytest

from lcab.cp import STRATEGIES
from lcab.report.gpu_verification import (
    cp_verification_markdown,
    read_verification,
    verification_markdown,
)
from tests.gpu import cp_shared
from tests.gpu.cp_shared import SECONDS_PER_CELL, CPCell, cells, classify, cuda_kernels, run, shard


def test_every_strategy_kernel_and_mask_is_a_cell():
    kernels = cuda_kernels()
    todo = cells(kernels)
    assert {c.strategy for c in todo} == set(STRATEGIES.names())
    assert {(c.strategy, c.world) for c in todo if c.world == 4} == {("usp", 4), ("loongtrain", 4)}
    assert {c.mask for c in todo} == {"causal", "causal_document", "sliding_window"}
    assert {c.kernel for c in todo} == set(kernels) and "reference" not in kernels
    assert len(todo) == len(set(todo)) == len(STRATEGIES.names()) * len(kernels) * 3
    assert [c.world for c in todo] == sorted((c.world for c in todo), reverse=True)  # 4 first


def test_usp_and_loongtrain_run_only_with_a_ring_of_more_than_one_rank():
    """At world 2 their default Ulysses degree (the node's ranks) leaves a ring of one: the
    H100 rows of those cells repeated Ulysses and verified nothing of theirs."""
    for strategy, options, world in cp_shared.CONFIGS:
        if strategy in ("usp", "loongtrain"):
            built = STRATEGIES.get(strategy)(dict(options), world)
            ulysses = built.ulysses_degree(world)
            assert world // ulysses > 1, (strategy, options, world)
            if strategy == "usp":
                assert ulysses > 1  # and Ulysses groups too: both halves of USP
    assert ("usp", (), 2) not in cp_shared.CONFIGS and (
        "loongtrain",
        (),
        2,
    ) not in cp_shared.CONFIGS


def test_a_budget_cut_never_falls_on_the_world_of_four():
    """Each shard runs its world-4 cells (the only multi-rank rings of USP and LoongTrain)
    before any world-2 cell: a shard cut short by its budget loses world-2 cells first."""
    todo = cells(["ranges", "flex", "sdpa", "fa4"])
    kinds = [classify(c) for c in todo]
    for index in range(3):
        worlds = [c.world for c in shard(todo, kinds, 3, index)]
        assert worlds == sorted(worlds, reverse=True) and 4 in worlds


def test_dry_run_sorts_cells_as_a_gpu_machine_would():
    cell = CPCell("ring", (), 2, "sdpa", "causal")
    assert classify(cell) == "refused"  # a ring merges by LSE: SDPA returns none
    assert classify(CPCell("ring", (), 2, "ranges", "causal")) == "runs"
    assert classify(CPCell("ring", (), 2, "fa4", "causal")) == "runs"  # assumed installed
    assert classify(CPCell("ring", (), 2, "fa4", "causal"), assumed=()) == "refused"
    assert classify(CPCell("ulysses", (), 2, "flex", "causal")) == "compiled"


def test_list_prints_every_cell_and_the_estimate(capsys):
    assert cp_shared.main(["--list", "--kernels", "ranges,sdpa"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 * 2 * 3 + 1
    # sdpa returns no LSE on CUDA: it runs where no block is merged by LSE (Ulysses and the
    # all-gather ring at 2), never on the rings of USP and LoongTrain at 4
    assert out[-1].startswith("30 cells x fwd+bwd on 2 worlds: 21 run, 0 run a compiled kernel")


def test_shards_split_the_cells_once_with_balanced_expected_cost():
    todo = cells(["ranges", "flex", "sdpa", "fa4"])
    kinds = [classify(c) for c in todo]
    parts = [shard(todo, kinds, 3, i) for i in range(3)]
    assert sorted((c for part in parts for c in part), key=todo.index) == todo  # each cell once
    assert all(part == [c for c in todo if c in part] for part in parts)  # the list's order
    cost = dict(zip(todo, kinds, strict=True))
    loads = [sum(SECONDS_PER_CELL[cost[c]] for c in part) for part in parts]
    assert max(loads) - min(loads) <= max(SECONDS_PER_CELL.values())  # greedy: within one cell


def test_an_unknown_kernel_is_one_line_and_exit_2(capsys):
    assert cp_shared.main(["--list", "--kernels", "ranges,nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cp_shared: --kernels nope unknown; valid: ") and "ranges" in err


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_the_step_verifies_the_portable_kernel_on_staged_cpu_ranks(tmp_path):
    todo = [
        CPCell("ring", (), 2, "ranges", "causal_document"),
        CPCell("ring", (), 2, "fa4", "causal"),  # refused here (no CUDA, not installed)
        CPCell("loongtrain", (("ulysses_degree", 1),), 4, "ranges", "sliding_window"),
    ]
    out = tmp_path / "verification.jsonl"
    rows = run(todo, "cpu", 600.0, out)
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    verdicts = {(r["cp"], r["kernel"], r["pass"]): r["verdict"] for r in rows}
    assert verdicts == {
        ("ring", "ranges", "fwd"): "verified",
        ("ring", "ranges", "bwd"): "verified",
        ("ring", "fa4", "fwd"): "unsupported",
        ("ring", "fa4", "bwd"): "unsupported",
        ("loongtrain", "ranges", "fwd"): "verified",
        ("loongtrain", "ranges", "bwd"): "verified",
    }
    for row in rows:
        if row["verdict"] == "verified":
            assert row["staging"] == "all" and row["comm_bytes"]
            assert all(sent == planned for sent, planned in row["comm_bytes"].values())
            assert all(row["errors"][n] <= row["bounds"][n] for n in row["errors"])
    assert run(todo, "cpu", 0.0, None) == []  # a spent budget starts nothing


def test_cp_rows_stay_out_of_the_kernel_table(tmp_path):
    kernel_row = {"kernel": "fa4", "mask": "causal", "pass": "fwd", "verdict": "verified"}
    cp_row = {**kernel_row, "verdict": "failed", "cp": "ring", "world": 2, "error": "boom"}
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps(kernel_row) + "\n" + json.dumps(cp_row) + "\n")
    assert read_verification(path) == [kernel_row]  # the support matrix's marks: kernel rows
    assert read_verification(path, cp=True) == [cp_row]
    assert "FAILED" not in verification_markdown(read_verification(path))
    table = cp_verification_markdown(read_verification(path, cp=True))
    assert "| `ring` @2 | `fa4` | FAILED / · |" in table and "boom" in table
    bad = {k: v for k, v in cp_row.items() if k != "world"}
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match="missing world"):
        read_verification(path, cp=True)


def test_gpu_table_prints_the_cp_table_when_the_file_has_cp_rows(tmp_path, capsys):
    from lcab.report.__main__ import main

    kernel_row = {"kernel": "flex", "mask": "causal", "pass": "fwd", "verdict": "verified"}
    cp_row = {**kernel_row, "cp": "usp", "world": 4, "cp_options": {"ulysses_degree": 2}}
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps(kernel_row) + "\n")
    assert main(["gpu-table", str(path)]) == 0
    assert "| strategy | kernel |" not in capsys.readouterr().out  # no CP rows: no CP table
    path.write_text(json.dumps(kernel_row) + "\n" + json.dumps(cp_row) + "\n")
    assert main(["gpu-table", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| `usp` [ulysses_degree=2] @4 | `flex` | verified / · |" in out
