"""NCCL context parallelism on every visible GPU (marker ``gpu``; needs at least 2 GPUs).

Each strategy runs a causal and a causal-document mask, forward and backward, through the whole
app on NCCL with the portable ``ranges`` kernel (no install) — numerics against the fp64
reference, and every operation's measured bytes equal to the plan's analytic bytes, as the gloo
tier proves on CPU. This is what turns "CP works on gloo" into "CP works on GPUs".
"""

from __future__ import annotations

import pytest
import torch

from lcab.cp import STRATEGIES
from tests.helpers.cli import read_jsonl, run_lcab
from tests.helpers.run_if import run_if

pytestmark = pytest.mark.gpu

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@run_if(min_gpus=2)
@pytest.mark.parametrize("strategy", STRATEGIES.names())
def test_nccl_cp_matches_the_reference_and_moves_the_planned_bytes(strategy, tmp_path):
    world = GPUS if GPUS in (2, 4, 8) else 2
    extra = ["cp.ulysses_degree=2"] if strategy in ("usp", "loongtrain") and world >= 4 else []
    done = run_lcab(
        "-m",
        f"cp={strategy}",
        *extra,
        "kernel=ranges",
        "mask=causal,causal_document",
        "problem.device=cuda",
        "problem.dtype=bfloat16",
        "problem.heads_q=16",
        "problem.heads_kv=8",
        f"topology.devices_per_node={world}",
        "topology.backend=nccl",
        "seqlen.values=[8192]",
        "bench=quick",
        "bench.progress=false",
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(tmp_path / "records.jsonl")
    assert len(records) == 2
    for record in records:
        assert record["status"] == "ok", (record["mask"], record["reasons"], record["error_msg"])
        assert record["world_size"] == world
        for op, (measured, analytic) in record["comm_bytes_by_op"].items():
            assert measured == analytic, op
