"""``python -m lcab.report compare``: two campaigns made for the purpose, with known effects.

Every cell's repetitions are drawn around its time with 3 % log-normal noise, fresh in each
campaign; NEW is OLD with one cell 5 % slower and one 0.5 % slower, a pass that now runs out of
memory, a different driver and a rebuilt kernel binary, one length dropped and one added. The
statistics are checked against what is known without them: a pure scale factor is found
exactly, the interval's order statistic is the published table's, and the interval covers the
true ratio about 95 % of the time.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lcab.bench.environment import driver_version, kernel_provenance
from lcab.bench.results import SampleMeasure, summarise
from lcab.bench.timing import Timing, quantiles
from lcab.records.schema import MAX_KEPT_REPS, PassResult
from lcab.report.__main__ import main
from lcab.report.compare import compare
from lcab.report.compare_stats import PassTimes, compare_times, rank_interval
from lcab.report.frame import load_records
from tests.helpers.synthetic_records import measured, write_sweep

KERNELS, MASKS, LENGTHS = ("sdpa", "ranges", "flex"), ("causal", "document"), (1024, 2048)
REPS, NOISE = 30, 0.03
SLOW, SLIGHT = ("ranges", "causal", 2048), ("flex", "document", 1024)


def _reps(rng: np.random.Generator, ms: float) -> list[float]:
    return [float(t) for t in ms * np.exp(rng.normal(0.0, NOISE, REPS))]


def _campaign(root: Path, seed: int, new: bool) -> Path:
    """One record per cell (kernel x mask x length); ``new``: the planted changes."""
    rng = np.random.default_rng(seed)
    jobs = []
    for job, (kernel, mask) in enumerate((k, m) for k in KERNELS for m in MASKS):
        records = []
        lengths = (*LENGTHS, 4096) if new and kernel == "sdpa" else LENGTHS
        for seqlen in lengths:
            if (kernel, mask, seqlen) == ("flex", "causal", 1024) and new:
                continue  # dropped from the new campaign
            factor = {SLOW: 1.05, SLIGHT: 1.005}.get((kernel, mask, seqlen), 1.0) if new else 1.0
            record = measured(kernel, mask, seqlen, job=job, sweep=root.name, ms=seqlen / 100)
            for name in ("fwd", "bwd"):
                result = record.pass_result(name)
                reps = _reps(rng, result.ms_p50 * factor)
                q = quantiles(reps, (0.2, 0.5, 0.8))
                result.ms_reps, result.ms_p20, result.ms_p50, result.ms_p80 = reps, *q.values()
            record.driver_version = "570.86.15" if new else "550.54.15"
            record.telemetry_power_limit_w = 500.0 if new and kernel == "flex" else 700.0
            record.kernel_binary = {"ext.so": "cd34" if new and kernel == "flex" else "ab12"}
            record.kernel_package_version = f"{kernel}-pkg 1.0"
            if (kernel, mask, seqlen) == (("sdpa", "document", 2048) if new else SLIGHT):
                record.bwd = PassResult(status="oom", reason="CUDA out of memory")
                record.status = "oom"  # NEW: a pass stops running, and the other one starts
            records.append(record)
        jobs.append(records)
    return write_sweep(root, jobs)


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory):
    root = tmp_path_factory.mktemp("campaigns")
    return _campaign(root / "old", seed=1, new=False), _campaign(root / "new", seed=2, new=True)


@pytest.fixture(scope="module")
def comparison(campaigns):
    old, new = campaigns
    return compare(load_records(old), load_records(new), ("old", "new"))


def _row(comparison, kernel, mask, seqlen, pass_):
    cells = comparison.cells
    found = cells[
        (cells["series"] == kernel)
        & (cells["mask"] == mask)
        & (cells["seqlen"] == seqlen)
        & (cells["pass"] == pass_)
    ]
    assert len(found) == 1
    return found.iloc[0]


def test_a_planted_5_percent_slowdown_is_found_and_a_half_percent_one_is_not(comparison):
    for pass_ in ("fwd", "bwd"):
        slow = _row(comparison, *SLOW, pass_)
        assert slow["verdict"] == "slower" and slow["basis"] == "reps"
        assert slow["low"] < 1.05 < slow["high"] and slow["low"] > 1.02
    slight = _row(comparison, *SLIGHT, "fwd")
    assert slight["verdict"] == "within noise" and slight["low"] < 1 < slight["high"]
    assert _row(comparison, *SLIGHT, "bwd")["verdict"] == "started: was oom"
    # the gate at 2 %: only the planted slowdown (both passes) and the pass that stopped
    failing = comparison.gate(2.0)
    assert sorted(zip(failing["cell"], failing["pass"], strict=True)) == [
        ("ranges causal 2K", "bwd"),
        ("ranges causal 2K", "fwd"),
        ("sdpa document 2K", "bwd"),
    ]
    stopped = _row(comparison, "sdpa", "document", 2048, "bwd")
    assert stopped["verdict"] == "stopped: oom"
    # sorted by effect: the passes that stopped or started, then the planted slowdown
    first = list(zip(comparison.cells["cell"], comparison.cells["pass"], strict=True))[:4]
    assert sorted(first[:2]) == [("flex document 1K", "bwd"), ("sdpa document 2K", "bwd")]
    assert {cell for cell, _ in first[2:]} == {"ranges causal 2K"}


def test_a_changed_driver_and_binary_are_named_and_unchanged_things_are_not(comparison):
    table = comparison.provenance.set_index("what")
    assert table.loc["driver", "old"] == "550.54.15" and table.loc["driver", "new"] == "570.86.15"
    assert table.loc["driver", "differs"] == "≠"
    assert table.loc["kernel binary", "differs"] == "≠"
    assert "flex cd34" in table.loc["kernel binary", "new"]
    assert "flex ab12" in table.loc["kernel binary", "old"]
    assert table.loc["kernel package", "differs"] == ""
    assert table.loc["power limit (W)", "differs"] == "≠"  # one card capped in the new campaign
    assert "500" in str(table.loc["power limit (W)", "new"])
    assert "500" not in str(table.loc["power limit (W)", "old"])


def test_cells_of_one_campaign_only_are_listed_apart(comparison):
    lone = comparison.unmatched.to_dict("records")
    assert {"only in": "old", "cells": "flex causal", "seqlen": "1K", "status": "ok"} in lone
    assert {"only in": "new", "cells": "sdpa causal", "seqlen": "4K", "status": "ok"} in lone
    assert len(lone) == 3  # sdpa's 4K in both masks, flex causal 1K
    assert "flex causal 1K" not in set(comparison.cells["cell"])


def test_the_command_prints_within_120_columns_writes_its_files_and_gates(campaigns, capsys):
    old, new = campaigns
    out = old.parent / "out"
    args = ["compare", f"old={old}", f"new={new}", "--out", str(out)]
    assert main([*args, "--fail-slower", "2"]) == 1
    printed = capsys.readouterr()
    assert max(map(len, printed.out.splitlines())) <= 120
    assert "ranges causal 2K fwd: slower by +" in printed.err
    assert "sdpa document 2K bwd: stopped: oom" in printed.err
    assert "flex document 1K" not in printed.err
    assert main([*args, "--fail-slower", "6"]) == 1  # the stopped pass still fails it
    assert (out / "compare.csv").read_text().count("\n") == len(
        compare(load_records(old), load_records(new), ("old", "new")).cells
    ) + 1
    assert "| ranges causal 2K | fwd |" in (out / "compare.md").read_text()
    assert sorted(p.name for p in (out / "png").iterdir()) == [
        "compare_new_causal.png",
        "compare_new_document.png",
    ]
    assert main(["compare", str(old), str(old / "nothing.jsonl")]) == 2


@pytest.mark.filterwarnings(  # wandb-workspaces' pydantic-v1 validators (test_report_workspace)
    "ignore:Pydantic V1 style `@validator` validators are deprecated:DeprecationWarning"
)
def test_the_wandb_report_is_written_offline_with_the_comparison(campaigns, tmp_path, capsys):
    old, new = campaigns
    path = tmp_path / "report.json"
    args = ["compare", str(old), str(new), "--out", str(tmp_path), "--wandb-dry-run", str(path)]
    assert main([*args, "--entity", "team"]) == 0
    report = json.loads(path.read_text())
    assert report["project"] == {"name": "lcab", "entityName": "team"}
    text = next(b["content"] for b in report["spec"]["blocks"] if b["type"] == "markdown-block")
    assert "| ranges causal 2K | fwd |" in text and "570.86.15" in text
    assert main(["compare", "wandb:only-two/parts", str(new)]) == 2
    assert "wandb:ENTITY/PROJECT/GROUP" in capsys.readouterr().err


def test_a_pure_scale_factor_is_found_exactly_and_the_interval_is_the_tables():
    rng = np.random.default_rng(0)
    old = list(rng.lognormal(0.0, 0.05, 10))
    found = rank_interval(old, [t * 1.05 for t in old])
    assert found is not None and found.ratio == pytest.approx(1.05, rel=1e-12)
    # 10 + 10 repetitions: the 95 % interval runs from the 24th smallest of the 100 pairwise
    # log differences to the 24th largest (Mann-Whitney critical value 23, two-sided 5 %)
    new = list(rng.lognormal(0.0, 0.05, 10))
    diffs = sorted(math.log(b) - math.log(a) for a in old for b in new)
    found = rank_interval(old, new)
    assert found is not None
    assert found.low == pytest.approx(math.exp(diffs[23])) and found.high == pytest.approx(
        math.exp(diffs[-24])
    )
    assert rank_interval([1.0, 1.1, 1.2], [1.0, 1.1, 1.2]) is None  # 3 + 3 cannot give 95 %
    band = compare_times(PassTimes(10.0, 9.0, 12.0, [10.0] * 3), PassTimes(5.0, 4.5, 6.0))
    assert (band.basis, band.ratio, band.low, band.high) == ("p20–p80", 0.5, 4.5 / 12, 6 / 9)


def test_the_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(400):
        old, new = rng.lognormal(0.0, 0.05, 15), 1.03 * rng.lognormal(0.0, 0.05, 15)
        found = rank_interval(list(old), list(new))
        assert found is not None and found.low is not None and found.high is not None
        covered += found.low <= 1.03 <= found.high
    assert 0.92 <= covered / 400 <= 0.98


def _sample(times: list[float]) -> SampleMeasure:
    timing = Timing(tuple(times), quantiles(times, (0.5, 0.2, 0.8)), 0, "perf_counter")
    return SampleMeasure(timing=timing, rank_p50=[timing.p50], flops=10**9, dense_flops=10**9)


def test_a_pass_keeps_its_repetitions_in_order_bounded_by_the_paper_protocol():
    result = PassResult()
    summarise(result, [_sample([1.0, 2.0, 3.0]), _sample([4.0, 5.0, 6.0])], world=1)
    assert result.ms_reps == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    many = [float(i) for i in range(1500)]
    summarise(result, [_sample(many[:750]), _sample(many[750:])], world=1)
    assert result.ms_reps is not None and len(result.ms_reps) == MAX_KEPT_REPS == 20 * 30
    assert result.ms_reps == [float(int(i * 2.5)) for i in range(600)]  # every 2.5th, in order


def test_the_kernel_binary_is_the_hash_of_the_loaded_shared_object():
    import numpy.linalg  # noqa: F401 - its extension must be loaded

    found = kernel_provenance("numpy")
    assert found["kernel_package_version"] == f"numpy {np.__version__}"
    extension = Path(np.linalg._umath_linalg.__file__)  # type: ignore[attr-defined]
    expected = hashlib.sha256(extension.read_bytes()).hexdigest()[:16]
    assert found["kernel_binary"][extension.name] == expected
    assert kernel_provenance(None) == {}
    # a subpackage (flash_attn.cute) is looked up by the distributions with files under it
    assert kernel_provenance("numpy.linalg")["kernel_package_version"] == f"numpy {np.__version__}"
    assert kernel_provenance("numpy.absent")["kernel_package_version"] is None


def test_the_driver_version_is_read_as_the_driver_writes_it(tmp_path):
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.3.0\n"
    )
    assert driver_version(str(proc)) == "550.54.15"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release")
    assert driver_version(str(proc)) == "570.86.15"
    assert driver_version(str(tmp_path / "absent")) is None


def test_a_wandb_group_is_read_from_its_runs_records_artifacts(campaigns, monkeypatch):
    """A stand-in for W&B's public API as documented (``Api.runs(path, filters)``,
    ``Run.logged_artifacts``, ``Artifact.type``/``download(root)``): no server is reachable here."""
    import wandb

    from lcab.report.compare_wandb import fetched

    jobs = sorted(campaigns[0].glob("*/records.jsonl"))
    asked = []

    class Artifact:
        def __init__(self, kind: str, source: Path) -> None:
            self.type, self.source = kind, source

        def download(self, root: str) -> str:
            Path(root).mkdir(parents=True)
            (Path(root) / "records.jsonl").write_bytes(self.source.read_bytes())
            return root

    class Run:
        def __init__(self, number: int, source: Path) -> None:
            self.id, self.source = f"run{number}", source

        def logged_artifacts(self) -> list[Artifact]:
            return [Artifact("lcab-trace", self.source), Artifact("lcab-records", self.source)]

    class Api:
        def __init__(self, timeout: int) -> None:
            assert timeout > 0

        def runs(self, path: str, filters: dict[str, str]) -> list[Run]:
            asked.append((path, filters))
            return [Run(i, job) for i, job in enumerate(jobs)]

    monkeypatch.setattr(wandb, "Api", Api)
    name, _, folder = fetched("old=wandb:team/lcab/2026-01-01_00-00-00_abc").partition("=")
    assert name == "old" and asked == [("team/lcab", {"group": "2026-01-01_00-00-00_abc"})]
    assert len(load_records(folder)) == len(load_records(campaigns[0]))
