"""NCCL context parallelism on GPUs (marker ``gpu``): one GPU's parts, and CP on at least 2.

Each strategy runs a causal and a causal-document mask, forward and backward, through the whole
app on NCCL with the portable ``ranges`` kernel (no install) — numerics against the fp64
reference, and every operation's measured bytes equal to the plan's analytic bytes, as the gloo
tier proves on CPU. This is what turns "CP works on gloo" into "CP works on GPUs". The records
must also carry what only a GPU run fills in: the phases on the GPU clock, the reserved memory
and the rank with the peak, NCCL's version.

On one GPU: the phase clock reads the GPU (a device sleep the host never waits for), the seeded
inputs and the streamed reference give the CPU's numbers, and the L2-flush buffer stays out of
a memory reading.
"""

from __future__ import annotations

import time

import pytest
import torch

from lcab.bench.inputs import SeededInputs
from lcab.bench.memory import PeakMemory
from lcab.bench.timing import L2_FLUSH_BYTES, l2_flush_buffer
from lcab.cp import STRATEGIES
from lcab.cp.comm import STATS, phase, phase_clock
from lcab.kernels import Problem
from lcab.kernels.reference import streamed_rows
from lcab.masks import make_mask
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
        assert record["numerics_mode"] in ("full", "sampled") and record["fwd"]["errors"]
        assert record["nccl_version"] and record["torch_version"]
        assert record["phase_ms"]["fwd_total"] > 0
        for pass_ in ("fwd", "bwd"):
            # reserved: the allocator's rise over the region (0 when it reused its cache)
            assert record[pass_]["mem_reserved_mib"] >= 0 and record[pass_]["mem_peak_mib"] > 0
            assert record[pass_]["mem_delta_mib"] <= record[pass_]["mem_peak_mib"]
            assert 0 <= record[pass_]["mem_peak_rank"] < world


@run_if(cuda=True)
def test_phase_clock_reads_the_gpu_not_the_host():
    device = torch.device("cuda")
    torch.cuda._sleep(1000)  # the context and the sleep kernel loaded outside the reading (the
    torch.cuda.synchronize()  # first H100 run's host time, 1.5 s, was this process's CUDA start)
    STATS.reset()
    with phase_clock(device):
        host = time.perf_counter()
        with phase("compute"):
            torch.cuda._sleep(100_000_000)  # ~50 ms of device time; the launch returns at once
        host = time.perf_counter() - host
    gpu = STATS.seconds["compute"]
    STATS.reset()
    assert gpu > 20e-3 and gpu > 5 * host, (gpu, host)


@run_if(cuda=True)
def test_seeded_inputs_and_streamed_reference_match_the_cpu():
    mask = make_mask(
        "causal_document", 3000, seed=1, doc_source="uniform", min_doc_len=50, max_doc_len=900
    )
    results = []
    for device in ("cpu", "cuda"):
        problem = Problem(3000, 3000, 8, 2, 64, torch.float32, torch.device(device))
        source = SeededInputs(5, 3000, 0, problem)
        rows = torch.tensor([0, 17, 1500, 2999])
        keys = lambda a, b, s=source: (s.span("k", a, b), s.span("v", a, b))  # noqa: E731
        got = streamed_rows(
            source.rows("q", rows),
            rows,
            mask,
            keys,
            2,
            source.rows("dout", rows),
            chunk_bytes=1 << 20,
        )
        results.append([t.cpu() for t in got])
    for cpu, cuda in zip(*results, strict=True):
        assert torch.allclose(cpu, cuda, atol=1e-9, rtol=0)


@run_if(cuda=True)
def test_flush_buffer_stays_out_of_the_memory_reading():
    device = torch.device("cuda")
    torch.cuda.empty_cache()  # nothing cached: the region's 100 MiB must be a new segment
    flush = l2_flush_buffer(device)
    with PeakMemory(device, exclude_bytes=L2_FLUSH_BYTES) as memory:
        held = torch.empty(100 * 2**20, dtype=torch.int8, device=device)
    reading = memory.reading
    assert 99 * 2**20 <= reading.delta_bytes <= 101 * 2**20
    assert reading.peak_bytes < torch.cuda.memory_allocated(device) - L2_FLUSH_BYTES + 2**20
    # the rise over the region: the 100 MiB segment, not the flush buffer reserved before it
    assert reading.reserved_bytes is not None
    assert 100 * 2**20 <= reading.reserved_bytes <= 102 * 2**20
    del flush, held
