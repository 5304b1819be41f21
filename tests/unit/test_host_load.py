"""A busy host is named where a CPU measurement reads off the plan.

The Quick start's own run, with other work on the host, warned "off the plan" at 0.34-0.41x
with no hint why. Each record now carries the host's 1-minute load when its length began and
ended, its usable cores and the share of CPU time a hypervisor stole meanwhile
(`lcab.bench.host_load`), and the planner's warning names them when they explain it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lcab.bench import host_load
from lcab.bench.runner import run_cell
from lcab.bench.targets import KernelTarget
from lcab.config import resolve_cell
from lcab.kernels import get_kernel
from lcab.plan.record_prediction import attach
from lcab.records.schema import RunRecord, busy_host

STAT = """cpu  100 5 50 800 20 3 2 40 7 0
cpu0 50 2 25 400 10 1 1 20 3 0
intr 12345
"""


def test_proc_stat_busy_and_steal_ticks_by_hand():
    # busy: all eight first fields (100+5+50+800+20+3+2+40) less idle 800 and iowait 20
    assert host_load.cpu_ticks(STAT) == (200, 40)
    assert host_load.cpu_ticks("cpu  1 2 3 4 5 6 7") == (1 + 2 + 3 + 6 + 7, None)  # no steal
    assert host_load.cpu_ticks("intr 1") == (None, None)


def test_steal_share_is_stolen_over_busy_time_between_two_snapshots():
    start = host_load.LoadSnapshot(1.0, 1000, 100)
    end = host_load.LoadSnapshot(1.5, 1400, 200)
    fields = host_load.load_fields(start, end)
    assert fields["host_steal_share"] == pytest.approx(100 / 400)
    assert (fields["host_load_start"], fields["host_load_end"]) == (1.0, 1.5)
    unknown = host_load.load_fields(host_load.LoadSnapshot(None, None, None), end)
    assert unknown["host_steal_share"] is None and unknown["host_load_start"] is None


def _record(load: float | None, steal: float | None, device: str = "cpu") -> RunRecord:
    record = RunRecord(kernel="ranges", device=device, passes=["fwd"])
    record.host_load_start, record.host_cores, record.host_steal_share = load, 2, steal
    return record


@pytest.mark.parametrize(
    ("load", "steal", "device", "said"),
    [
        (
            2.06,
            0.0,
            "cpu",
            "; the host was busy: load average 2.06 on 2 cores when the length began",
        ),
        (0.3, 0.0, "cpu", ""),  # an idle host: the warning stands alone
        (0.3, 0.12, "cpu", "; the host was busy: 12% of CPU time stolen by the hypervisor"),
        (2.06, None, "cuda", ""),  # a GPU's time does not depend on the host's other work
        (None, None, "cpu", ""),
    ],
)
def test_the_warning_names_a_busy_host(load, steal, device, said):
    assert busy_host(_record(load, steal, device)) == said


def test_every_record_of_a_cell_carries_the_hosts_load(compose):
    cell = resolve_cell(
        compose(["kernel=naive", "mask=causal", "seqlen=tiny", "bench=quick", "problem.device=cpu"])
    )
    records: list[RunRecord] = []
    run_cell(cell.with_seqlens(cell.seqlens[:1]), KernelTarget(get_kernel("naive")), records.append)
    (record,) = records
    assert record.host_cores == host_load.usable_cores() >= 1
    assert record.host_load_start is not None and record.host_load_end is not None
    assert RunRecord.from_dict(record.to_dict()).host_cores == record.host_cores


@pytest.mark.parametrize(
    ("measured_ms", "said", "busy"),
    [
        (40.0, "fwd 0.25x (40 ms, 10 predicted)", True),  # 4x slower
        (2.5, "fwd 4x (2.5 ms, 10 predicted)", False),
    ],
)
def test_a_busy_host_explains_a_slow_run_and_not_a_fast_one(measured_ms, said, busy):
    """A run faster than planned on a loaded host is no sign of the load."""
    record = _record(2.06, 0.0)
    record.status, record.predicted_hardware = "ok", "cpu_gloo_local@auto"
    record.fwd.status, record.fwd.ms_p50 = "ok", measured_ms
    prediction = SimpleNamespace(pass_=lambda name: SimpleNamespace(time_ms=10.0, tflops=1.0))
    attach(record, prediction)
    assert record.prediction_warning is not None
    assert said in record.prediction_warning
    assert ("the host was busy: load average 2.06" in record.prediction_warning) == busy
