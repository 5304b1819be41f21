"""`python -m lcab.report anchors`: published figures beside lcab's records and planner rows.

Expectations are independent of the code under test: the published values a record should meet
are read straight out of the data file's JSON here (group and row, not through the loader), the
records are built by hand with known shapes and TFLOP/s, and every ratio is divided here.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lcab.cp import STRATEGIES
from lcab.flops import PASSES
from lcab.kernels import KERNELS
from lcab.masks import list_masks
from lcab.records.published import (
    PUBLISHED_FILE,
    READS,
    BadPublishedError,
    load_published,
    parse_published,
)
from lcab.records.schema import PassResult, RunRecord
from lcab.records.sinks import write_records
from lcab.report.__main__ import main
from lcab.report.anchor_rows import MEASURED, PREDICTED, gpu_model, read_lcab_rows
from lcab.report.anchors import side_by_side
from lcab.report.build import build_report
from tests.helpers.cli import ROOT, cli_env

H100_RECORDS = ROOT / "notebooks" / "data" / "gpu_h100_sweep_records.jsonl"
H200_RECORDS = ROOT / "notebooks" / "data" / "gpu_h200_sweep_records.jsonl"
RAW = json.loads(PUBLISHED_FILE.read_text(encoding="utf-8"))
WIDTH = 120
DIGITIZED = "magi_cp_digitized.csv"


def raw_value(figure: str, **wanted: Any) -> float:
    """The one value of group ``figure`` whose columns equal ``wanted`` (read from the JSON)."""
    (group,) = [g for g in RAW["groups"] if g["figure"] == figure]
    found = [
        row[group["columns"].index("value")]
        for row in group["rows"]
        if all(row[group["columns"].index(k)] == v for k, v in wanted.items())
    ]
    assert len(found) == 1, (figure, wanted, found)
    return float(found[0])


def record(
    kernel: str = "sdpa_cudnn",
    mask: str = "causal",
    seqlen: int = 8192,
    device_name: str = "NVIDIA H100 80GB HBM3",
    cp: str = "none",
    nodes: int = 1,
    per_node: int = 1,
    fwd: float | None = 600.0,
    bwd: float | None = 500.0,
    **extra: Any,
) -> RunRecord:
    """An ``ok`` record of a known shape (64:8 heads of 128, bf16) and known TFLOP/s."""

    def result(tflops: float | None) -> PassResult:
        if tflops is None:
            return PassResult(status="skipped", reason="not run")
        return PassResult(status="ok", ms_p50=1.0, tflops=tflops)

    return RunRecord(
        run_id=f"{kernel}-{mask}-{seqlen}-{device_name}-{cp}-{nodes}x{per_node}",
        created_at="2026-11-28T00:00:00",
        kernel=kernel,
        cp=cp,
        mask=mask,
        seqlen=seqlen,
        world_size=nodes * per_node,
        nodes=nodes,
        devices_per_node=per_node,
        heads_q=64,
        heads_kv=8,
        head_dim=128,
        dtype="bfloat16",
        device="cuda",
        device_name=device_name,
        passes=["fwd", "bwd"],
        status="ok",
        fwd=result(fwd),
        bwd=result(bwd),
        **extra,
    )


def pairs_of(tmp_path: Path, *records: RunRecord) -> list:
    path = write_records(tmp_path / "records.jsonl", records)
    return side_by_side(read_lcab_rows([path]))


# ---------------------------------------------------------------- the data file


def test_the_data_file_validates_and_every_number_says_where_from_and_how_read() -> None:
    published = load_published()
    assert len(published) == sum(len(g["rows"]) for g in RAW["groups"]) == 964
    counts: dict[str, int] = {}
    for p in published:
        counts[p.source_id] = counts.get(p.source_id, 0) + 1
        assert p.source and p.figure and p.url.startswith("https://")
        assert p.read in READS
        if p.read == "chart":  # a reading off an image states its error
            assert p.error is not None and 0 < p.error <= 5
        if p.repo:
            assert len(p.commit) == 40 and p.path and p.commit in p.url
        assert p.pass_ in PASSES and p.value > 0
        assert p.mask in list_masks()
        assert p.cp in ("none", *STRATEGIES.names())
        assert p.kernels and all(k in KERNELS.names() for k in p.kernels)
        assert p.tokens % p.world == 0
    # (a) the paper's tables first, then FA3, cudnn-frontend, the MagiAttention CP charts
    assert list(counts) == [
        "longca-v1",
        "fa3-paper",
        "cudnn-fe-gb200",
        "magi-cp-h100",
        "magi-cp-b200",
        "magi-kernel-h100",
    ]
    assert counts == {
        "longca-v1": 48 + 24 + 17 + 24 + 24,  # Tables 3, 4 (OOM cells out), 5
        "fa3-paper": 3 * 3 * 6,
        "cudnn-fe-gb200": 2 * 2 * 2 * 5,
        "magi-cp-h100": 5 * 4 * 8,
        "magi-cp-b200": 5 * 4 * 8,
        "magi-kernel-h100": 413,
    }


def group(**overrides: Any) -> dict[str, Any]:
    base = dict(RAW["groups"][0])  # a table group: LongCA-bench Table 3, FlashInfer
    return {"kernels": RAW["kernels"], "groups": [{**base, **overrides}]}


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"rows": [[-5, 64, 0.2, 1.0]]}, "group 1 (longca-v1) row 1: seqlen=-5: must be"),
        ({"rows": [[16384, 64, 0.2]]}, "row 1: expected 4 values"),
        ({"read": "chart"}, "row 1: field 'error' is missing"),
        ({"read": "guess"}, "read='guess': must be one of table, label, chart"),
        ({"library": "Mystery"}, "library='Mystery' is not in 'kernels'"),
        ({"gpus": "H100"}, "group 1 (longca-v1): unknown field 'gpus'"),
        ({"source": ""}, "source='': must be the citation"),
        ({"rows": []}, "group 1 (longca-v1): no rows"),
    ],
)
def test_a_bad_row_is_one_error_naming_the_row_and_field(
    overrides: dict[str, Any], says: str
) -> None:
    with pytest.raises(BadPublishedError, match=r"^published\.json: group 1") as err:
        parse_published(group(**overrides))
    assert says in str(err.value)


def test_the_cp_charts_agree_with_the_shared_digitisation_within_the_reading_errors() -> None:
    """The data file's readings of the H100 CP charts and the shared digitisation (±5) agree."""
    mine = {
        (p.cp, p.mask, p.pass_, p.world): p
        for p in load_published()
        if p.source_id == "magi-cp-h100"
    }
    places = (ROOT.parent / "data", ROOT.parent / "shared" / "data", Path("/work/shared/data"))
    shared = next((d / DIGITIZED for d in places if (d / DIGITIZED).is_file()), None)
    if shared is None:
        pytest.skip(f"{DIGITIZED} is beside some checkouts only")
    lines = shared.read_text().splitlines()[1:]  # line 1: its source
    names = {"ring_p2p": "ring", "varlen_causal": "causal_document"}
    checked = 0
    for row in csv.DictReader(lines):
        cp, mask = names.get(row["strategy"], row["strategy"]), names.get(row["mask"], row["mask"])
        for world in ("8", "16", "32", "64"):
            key = (cp, mask, row["wd"], int(world))
            if row["gpu"] == "H100" and key in mine:
                assert abs(mine[key].value - float(row[world])) <= 5 + (mine[key].error or 0)
                checked += 1
    assert checked == 3 * 4 * 5 + 4 * 5  # varlen_causal fwd/bwd, full, causal fwd x 5 x 4


# ---------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("H100 SXM5 80 GB, 8 per node", "H100"),
        ("h100_nvlink_ib", "H100"),
        ("AMD Instinct MI300X", "MI300X"),
        ("2-core x86 VM", None),
    ],
)
def test_gpu_models_are_read_from_device_and_profile_names(name: str, model: str | None) -> None:
    assert gpu_model(name) == model


def test_a_record_meets_exactly_the_published_numbers_of_its_shape(tmp_path: Path) -> None:
    pairs = pairs_of(tmp_path, record())  # sdpa_cudnn, causal, 8K, one H100, 600 / 500
    fwd = raw_value("kernel/h100/causal_mask/fwd", library="cuDNN", seqlen=8192)
    bwd = raw_value("kernel/h100/causal_mask/bwd", library="cuDNN", seqlen=8192)
    # the FA3 paper's cuDNN at 8K is 16 heads and batch 2; cudnn-frontend's is a GB200
    assert [(s.published.source_id, s.published.pass_, s.published.value) for s in pairs] == [
        ("magi-kernel-h100", "fwd", fwd),
        ("magi-kernel-h100", "bwd", bwd),
    ]
    assert [s.lcab.label for s in pairs] == [MEASURED, MEASURED]
    assert pairs[0].ratio == pytest.approx(600.0 / fwd)
    assert pairs[1].ratio == pytest.approx(500.0 / bwd)


def test_an_h200_record_never_meets_an_h100_figure(tmp_path: Path) -> None:
    assert pairs_of(tmp_path, record(device_name="NVIDIA H200")) == []
    write_records(tmp_path / "records.jsonl", [record(device_name="NVIDIA H200")])
    every = side_by_side(read_lcab_rows([tmp_path / "records.jsonl"]), unmatched=True)
    assert all(s.lcab is None for s in every)
    reasons = {s.why for s in every if s.published.gpu == "H100"}
    assert reasons == {"no lcab row on H100"}


def test_kernel_pass_mask_parameters_and_nodes_must_all_agree(tmp_path: Path) -> None:
    fa3 = pairs_of(tmp_path, record(kernel="fa3", bwd=None))  # no backward: fwd only
    assert [(s.published.library, s.published.pass_) for s in fa3] == [("FA3", "fwd")]
    assert fa3[0].published.value == raw_value(
        "kernel/h100/causal_mask/fwd", library="FA3", seqlen=8192
    )
    assert pairs_of(tmp_path, record(kernel="fa4")) == []  # nobody published FA4 on an H100
    window = {"mask": "sliding_window_causal", "seqlen": 32768}
    assert pairs_of(tmp_path, record(**window, mask_params={"window": 512})) == []
    matched = pairs_of(tmp_path, record(**window, mask_params={"window": 1024}))
    assert {s.published.mask_params["window"] for s in matched} == {1024} and len(matched) == 2
    # CP: ulysses on one node of 8 at 8K per GPU meets the blog's cell; 2 nodes of 4 do not
    cp = {"kernel": "fa3", "cp": "ulysses", "mask": "causal_document", "seqlen": 65536}
    (bwd,) = [s for s in pairs_of(tmp_path, record(**cp, per_node=8, fwd=None, bwd=300.0))]
    expected = raw_value("distributed/h100/varlen_causal_mask/bwd", cp="ulysses", world=8)
    assert (bwd.published.source_id, bwd.published.value) == ("magi-cp-h100", expected)
    assert bwd.ratio == pytest.approx(300.0 / expected)
    write_records(tmp_path / "records.jsonl", [record(**cp, nodes=2, per_node=4)])
    every = side_by_side(read_lcab_rows([tmp_path / "records.jsonl"]), unmatched=True)
    (cell,) = [s for s in every if s.published.cp == "ulysses" and s.published.world == 8][:1]
    assert cell.lcab is None and cell.why == "no lcab row with 8 GPUs a node"


# ---------------------------------------------------------------- planner rows


@pytest.fixture(scope="module")
def plan_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real planner sweep: Ulysses and USP, causal_document on 1x8 (as the README's)."""
    cwd = tmp_path_factory.mktemp("plan")
    argv = [sys.executable, "-m", "lcab.plan", "-m", "cp=ulysses,usp", "topology=1x8"]
    done = subprocess.run(
        [*argv, "mask=causal_document"], cwd=cwd, env=cli_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (sweep,) = (cwd / "outputs" / "plans").glob("*/*")
    return sweep


def test_planner_rows_are_labelled_predicted_and_meet_the_published_cp_cells(
    plan_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = read_lcab_rows([plan_sweep])
    assert len(rows) == 2 and {r.label for r in rows} == {PREDICTED}
    assert {(r.gpu, r.heads_q, r.heads_kv, r.head_dim, r.dtype) for r in rows} == {
        ("H100", 64, 8, 128, "bfloat16")  # profile h100_nvlink_ib; problem: auto on cuda
    }
    pairs = side_by_side(rows)
    by_key = {(s.published.cp, s.published.pass_): s for s in pairs}
    assert set(by_key) == {(cp, p) for cp in ("ulysses", "usp") for p in ("fwd", "bwd")}
    plan = {
        json.loads(line)["cp"]: json.loads(line)
        for file in plan_sweep.rglob("plan.jsonl")
        for line in file.read_text().splitlines()
    }
    for (cp, pass_), s in by_key.items():
        figure = f"distributed/h100/varlen_causal_mask/{pass_}"
        assert s.published.value == raw_value(figure, cp=cp, world=8)
        assert s.ratio == pytest.approx(plan[cp][f"{pass_}_tflops"] / s.published.value)
    assert main(["anchors", str(plan_sweep)]) == 0
    out = capsys.readouterr().out
    assert "predicted (planner): fa3" in out and "2 predicted" in out
    assert "magi-cp-h100: MagiAttention blog" in out


# ---------------------------------------------------------------- the command


def test_the_cli_on_the_committed_h100_records_prints_the_table_with_sources(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["anchors", str(H100_RECORDS)]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= WIDTH for line in out.splitlines())
    assert "measured: sdpa_cudnn" in out and "magi-kernel-h100" in out
    assert "6 lcab rows (6 measured, 0 predicted); 8 of 964 published figures" in out
    assert "chart, read off the image ±3 TFLOP/s; SandAI-org/MagiAttention@2c641357" in out
    assert main(["anchors", str(H100_RECORDS), str(H200_RECORDS), "--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "| published figure | GPU | heads |" in markdown and "- magi-kernel-h100:" in markdown


def test_the_cli_on_the_h200_records_says_why_nothing_matches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["anchors", str(H200_RECORDS)]) == 0
    assert "0 of 964 published figures have a match" in capsys.readouterr().out
    assert main(["anchors", str(H200_RECORDS), "--all"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= WIDTH for line in out.splitlines())
    assert "] no lcab row on H100" in out and "] no lcab row on GB200" in out
    assert "fa3-paper: FlashAttention-3" in out


@pytest.mark.parametrize("bad", ["missing.jsonl", "text.jsonl", "empty_dir"])
def test_bad_input_is_one_line_naming_the_path_and_exit_2(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "text.jsonl").write_text('{"name": "not lcab"}\n')
    (tmp_path / "empty_dir").mkdir()
    path = tmp_path / bad
    assert main(["anchors", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"python -m lcab.report anchors: {path}")


def test_the_report_gains_the_section_only_when_a_figure_matches(tmp_path: Path) -> None:
    built = build_report([H100_RECORDS], out=tmp_path / "h100")
    page = built.index.read_text(encoding="utf-8")
    assert '<section id="anchors"><h2>Published figures side by side</h2>' in page
    assert "magi-kernel-h100" in page and "measured: sdpa_cudnn" in page
    markdown = (built.folder / "anchors.md").read_text(encoding="utf-8")
    assert markdown.count("| cuDNN causal fwd |") == markdown.count("| cuDNN causal bwd |") == 2
    assert markdown.count("| cuDNN causal_document ") == 4 and "Sources:" in markdown
    other = build_report([H200_RECORDS], out=tmp_path / "h200")
    assert 'id="anchors"' not in other.index.read_text(encoding="utf-8")
    assert not (other.folder / "anchors.md").exists()
