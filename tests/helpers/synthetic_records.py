"""Records with known numbers, written as a sweep writes them, for the report's tests.

`measured` builds a `RunRecord` whose throughput follows lcab's definition (FLOPs over world
size x time), `failed` one that ended in a failure status, and `write_sweep` lays records out
like ``python -m lcab.main -m``: one ``<n>_<overrides>/records.jsonl`` per job plus the merged
``records.jsonl`` at the root (through the real `merge_records`). `example_sweeps` writes a
kernel sweep and a CP sweep with a failure of each kind the figures mark, so every figure of
the report has data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lcab.records.schema import PassResult, RunRecord
from lcab.records.sinks import RECORDS_FILE, merge_records, write_records

PASS_NAMES = ("fwd", "bwd")
LENGTHS = (1024, 2048, 4096, 8192)
"""Lengths of the example kernel sweep (`kernel_jobs`); the CP sweep runs the first two."""


def _pass(flops: int, ms: tuple[float, float, float], world: int) -> PassResult:
    p20, p50, p80 = ms
    return PassResult(
        status="ok",
        ms_p20=p20,
        ms_p50=p50,
        ms_p80=p80,
        reps=3,
        flops=flops,
        tflops=flops / (p50 / 1e3) / 1e12 / world,
        mem_peak_mib=flops / 1e7,
        max_abs_err=1e-7 * (1 + flops % 7),
    )


def measured(
    kernel: str,
    mask: str,
    seqlen: int,
    *,
    cp: str = "none",
    world: int = 1,
    sweep: str = "sweep",
    job: int = 0,
    ms: float = 10.0,
    dtype: str = "float32",
) -> RunRecord:
    """An ``ok`` record: fwd and bwd with p20/p50/p80 times around ``ms`` (bwd 2.5x slower)."""
    flops = 4 * seqlen * seqlen * 64 * 8 // 2
    record = RunRecord(
        run_id=f"{sweep}-{job}-{seqlen}",
        sweep_id=sweep,
        job_num=job,
        created_at="2026-01-01T00:00:00+00:00",
        kernel=kernel,
        cp=cp,
        mask=mask,
        seqlen=seqlen,
        world_size=world,
        dtype=dtype,
        passes=list(PASS_NAMES),
        status="ok",
        numerics_tolerance=1e-3,
        fwd=_pass(flops, (0.9 * ms, ms, 1.2 * ms), world),
        bwd=_pass(int(2.5 * flops), (2.4 * ms, 2.5 * ms, 2.9 * ms), world),
    )
    if cp != "none":
        record.cp_params = {"balance": "zigzag"}
        record.balance_imbalance = 1.0 + 0.01 * world
        record.comm_bytes_measured = record.comm_bytes_analytic = seqlen * 4096 * world
    return record


def failed(
    kernel: str,
    mask: str,
    seqlen: int,
    status: str,
    reason: str,
    *,
    cp: str = "none",
    world: int = 1,
    sweep: str = "sweep",
    job: int = 0,
) -> RunRecord:
    """A record whose fwd ended in ``status`` for ``reason`` and whose bwd was not run."""
    record = RunRecord(
        run_id=f"{sweep}-{job}-{seqlen}",
        sweep_id=sweep,
        job_num=job,
        created_at="2026-01-01T00:00:00+00:00",
        kernel=kernel,
        cp=cp,
        mask=mask,
        seqlen=seqlen,
        world_size=world,
        dtype="float32",
        passes=list(PASS_NAMES),
        status=status,
        reasons=[f"fwd: {reason}", "bwd: not run: fwd failed"],
        fwd=PassResult(status=status, reason=reason),
        bwd=PassResult(status="skipped", reason="not run: fwd failed"),
    )
    if status in ("error", "oom"):
        record.error_type, record.error_msg = "RuntimeError", reason
    return record


def write_sweep(root: Path, jobs: Sequence[Sequence[RunRecord]]) -> Path:
    """``root`` as a sweep folder: job ``n``'s records in ``<n>_job/``, merged at the root."""
    for number, records in enumerate(jobs):
        folder = root / f"{number}_kernel={records[0].kernel},mask={records[0].mask}"
        folder.mkdir(parents=True, exist_ok=True)
        write_records(folder / RECORDS_FILE, records)
    merge_records(root)
    return root


def kernel_jobs() -> list[list[RunRecord]]:
    """sdpa and ranges on causal and document; sdpa/causal runs out of memory at 8K."""
    jobs = []
    for job, (kernel, mask) in enumerate(
        [("sdpa", "causal"), ("sdpa", "document"), ("ranges", "causal"), ("ranges", "document")]
    ):
        records = [
            measured(kernel, mask, s, job=job, sweep="kernels", ms=s / 100 * (job + 1))
            for s in LENGTHS
        ]
        if (kernel, mask) == ("sdpa", "causal"):
            records[-1] = failed(
                kernel, mask, 8192, "oom", "CUDA out of memory", sweep="kernels", job=job
            )
        jobs.append(records)
    return jobs


def cp_jobs() -> list[list[RunRecord]]:
    """ring/ranges at world 2 and 4, ulysses/ranges at world 2 (whose 2K errors), causal."""
    jobs = []
    for job, (cp, world) in enumerate([("ring", 2), ("ring", 4), ("ulysses", 2)]):
        records = [
            measured("ranges", "causal", s, cp=cp, world=world, sweep="cp", job=job, ms=s / 50)
            for s in LENGTHS[:2]
        ]
        if cp == "ulysses":
            records[-1] = failed(
                "ranges", "causal", 2048, "error", "boom", cp=cp, world=world, sweep="cp", job=job
            )
        jobs.append(records)
    return jobs


def example_sweeps(root: Path) -> tuple[Path, Path]:
    """``root/kernels`` (`kernel_jobs`) and ``root/cp`` (`cp_jobs`) as sweep folders."""
    return write_sweep(root / "kernels", kernel_jobs()), write_sweep(root / "cp", cp_jobs())
