"""Where a context-parallel step spends its time on CPU: compute, communication and waiting.

Every strategy runs as the app runs it (Hydra config composed in-process, one supervised cell of
gloo ranks, ``ranges``, ``causal_document``), so the figures are a record's, not a
re-implementation's (the columns: `LEGEND`). A cell whose backward fails runs again
forward-only, so one broken pass does not hide the other's figures.
"""

from __future__ import annotations

import os
import tempfile
import time

from lcab.config import CONF_DIR
from lcab.cp import STRATEGIES
from lcab.records.schema import RunRecord

TOPOLOGY = "local4"
KERNEL = "ranges"
MASK = "causal_document"
SEQLEN = 8192
BENCH = "quick"
#: Per-strategy overrides: 2 Ulysses x 2 ring at world 4 (the default would leave a ring of 1).
EXTRA = {"usp": ["cp.ulysses_degree=2"], "loongtrain": ["cp.ulysses_degree=2"]}


def overrides(strategy: str, passes: tuple[str, ...], seqlen: int = SEQLEN) -> list[str]:
    """Hydra overrides for one cell (numerics off: rank 0's check would land in peers' waits)."""
    return [
        f"cp={strategy}",
        f"topology={TOPOLOGY}",
        f"kernel={KERNEL}",
        f"mask={MASK}",
        f"bench={BENCH}",
        f"seqlen.values=[{seqlen}]",
        f"bench.passes=[{','.join(passes)}]",
        "bench.check_numerics=false",
        "bench.progress=false",
        "logger=none",
        *EXTRA.get(strategy, []),
    ]


def run_cell(
    strategy: str, passes: tuple[str, ...], output_dir: str, seqlen: int = SEQLEN
) -> list[RunRecord]:
    """Compose the app's config for ``strategy`` and run its cell; the records it produced."""
    from hydra import compose, initialize_config_dir

    from lcab.bench.supervisor import run_supervised
    from lcab.cell import JobInfo
    from lcab.config import register_configs, resolve_cell

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides(strategy, passes, seqlen))
    job = JobInfo(output_dir=output_dir, run_id=f"perf-cp-{strategy}", sweep_id="perf-cp")
    return run_supervised(resolve_cell(cfg, job), lambda record: None)


def _mb(value: float | None) -> float | None:
    return None if value is None else value / 2**20


def _cell(value: float | None, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:>{width}.{digits}f}"


def lines_of(record: RunRecord, note: str = "") -> list[str]:
    """Table lines of one record: one per timed pass (or one saying why it failed)."""
    from lcab.cp.comm import is_backward_op

    name = record.cp
    if record.status != "ok":
        why = "; ".join(record.reasons) or record.error_msg or ""
        failure = f"{record.status}: {why.splitlines()[0][:110] if why else '?'}"
        return [f"{name:14s} {'-':7s} {f'{note} {failure}'.strip()}"]
    by_op = record.comm_bytes_by_op or {}
    phases = record.phase_ms or {}
    cp = record.cp_params
    layout = f"u{cp.get('ulysses_degree')} x r{cp.get('ring_degree')}"
    layout += f" w{cp.get('windows')} {cp.get('balancer')}"
    lines = []
    for pass_ in (p for p in ("fwd", "bwd") if p in record.passes):
        result = record.pass_result(pass_)
        ops = [v for op, v in by_op.items() if is_backward_op(op) == (pass_ == "bwd")]
        spread = ""
        if result.rank_ms_p50:
            spread = f"{min(result.rank_ms_p50):.1f}-{max(result.rank_ms_p50):.1f}"
        total, compute, comm, wait, other = (
            phases.get(f"{pass_}_{k}") for k in ("total", "compute", "comm", "wait", "other")
        )
        lines.append(
            f"{name:14s} {pass_:7s} {_cell(result.ms_p50, 8)} {spread:>13s}"
            f" {_cell(total, 8)} {_cell(compute, 8)} {_cell(comm, 7)} {_cell(wait, 7)}"
            f" {_cell(other, 7)} {_cell(_mb(sum(m for m, _ in ops)), 8, 2)}"
            f" {_cell(_mb(sum(a for _, a in ops)), 8, 2)}"
            f" {_cell(record.balance_imbalance, 6, 3)}  {f'{note} {layout}'.strip()}"
        )
    return lines


def breakdown(strategy: str, output_dir: str) -> list[str]:
    """Lines of one strategy; forward-only (after the failure line) if fwd+bwd fails."""
    records = run_cell(strategy, ("fwd", "bwd"), output_dir)
    lines = [line for record in records for line in lines_of(record)]
    if any(record.status != "ok" for record in records):
        retry = run_cell(strategy, ("fwd",), output_dir)
        lines += [line for record in retry for line in lines_of(record, "fwd only (rerun)")]
    return lines


HEADER = (
    f"{'strategy':14s} {'pass':7s} {'p50 ms':>8s} {'rank p50 ms':>13s}"
    f" {'call ms':>8s} {'compute':>8s} {'comm':>7s} {'wait':>7s} {'other':>7s} {'MB meas':>8s}"
    f" {'MB plan':>8s} {'imbal':>6s}  layout"
)
LEGEND = """\
p50 ms: slowest rank, median of reps; rank p50 ms: min-max of each rank's own p50.
call ms: one extra untimed call of the pass (all ranks start after a barrier), on its slowest
rank, split into compute (kernel fwd/bwd), comm (collectives, incl. waiting for peers inside
them), wait (blocking on posted P2P transfers) and other (merges, copies, Python/autograd).
MB meas / MB plan: bytes one rank sent (max over ranks) vs the plan's analytic volume.
layout: Ulysses degree x ring degree, LoongTrain windows, balancer."""


def run() -> None:
    """Run every strategy on one length and print the breakdown."""
    # the workers inherit this: torch's deprecation notices would bury the table
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    start = time.perf_counter()
    print(
        f"== CP time breakdown on CPU: world 4 ({TOPOLOGY}, gloo, 1 thread per rank), kernel"
        f" {KERNEL}, mask {MASK}, S = {SEQLEN:,}, bench={BENCH} (3 reps), numerics off =="
    )
    print(f"{os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.1f}")
    print(LEGEND)
    print(HEADER)
    print("-" * len(HEADER))
    with tempfile.TemporaryDirectory(prefix="lcab-perf-cp-") as tmp:
        for strategy in STRATEGIES.names():
            t0 = time.perf_counter()
            for line in breakdown(strategy, tmp):
                print(line)
            print(f"{'':14s} ({time.perf_counter() - t0:.1f} s wall for this strategy)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(f"total {time.perf_counter() - start:.1f} s")
