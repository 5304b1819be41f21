"""The shipped H100 kernel rates are the fit of the public figures, and the fit is sound."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from lcab.plan.hardware import load_profile
from lcab.plan.kernel_figures import (
    FIGURES_DIR,
    Figure,
    Figures,
    figure_work,
    fit_kernel,
    fit_profile,
    load_figures,
    main,
    predicted_tflops,
)
from lcab.plan.model import CostModel


def test_the_shipped_h100_kernel_rates_are_the_fit_of_its_figures():
    """Edit a figure or a profile number and this fails until the other follows."""
    shipped = load_profile("h100_nvlink_ib")
    fitted, fits = fit_profile(load_figures(FIGURES_DIR / "h100_nvlink_ib.yaml"), shipped)
    kernels = {"fa3", "fa2", "cudnn", "ffa", "flex", "fa4", "sdpa_cudnn"}
    assert {f.kernel for f in fits} == kernels
    for kernel in (*kernels, "default"):
        want, got = fitted.kernels[kernel], shipped.kernels[kernel]
        for name in ("fwd_tflops", "bwd_tflops", "half_keys", "bwd_half_keys", "bias_bytes"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=0.01), (
                kernel,
                name,
            )
        assert got.call_us == pytest.approx(want.call_us, abs=0.5), kernel
        if want.bwd_bias_bytes is not None:
            assert got.bwd_bias_bytes == pytest.approx(want.bwd_bias_bytes, rel=0.02), kernel
    fa3 = next(f for f in fits if f.kernel == "fa3")
    assert max(abs(value / f.tflops - 1) for f, value in fa3.rows) < 0.06
    # lcab's own H100 kernels: each figure within 8 % of its fit, the dense-bias ones included
    for fit in fits:
        if fit.kernel in ("fa4", "sdpa_cudnn"):
            assert max(abs(value / f.tflops - 1) for f, value in fit.rows) < 0.08, fit.kernel


def test_lcab_h100_figures_are_the_records_they_cite():
    """The `lcab_h100` series hold the records' throughputs (to 0.1), record for record."""
    import json

    path = Path(__file__).resolve().parents[2] / "notebooks/data/gpu_h100_sweep_records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    measured = {
        (r["kernel"], r["mask"], pass_, r["seqlen"]): r[pass_]["tflops"]
        for r in records
        if r["status"] == "ok" and r["cp"] == "none"
        for pass_ in ("fwd", "bwd")
    }
    figures = [
        f
        for f in load_figures(FIGURES_DIR / "h100_nvlink_ib.yaml").figures
        if f.source == "lcab_h100"
    ]
    assert {(f.kernel, f.mask, f.pass_, f.seqlen) for f in figures} == set(measured)
    for f in figures:
        assert f.tflops == pytest.approx(measured[f.kernel, f.mask, f.pass_, f.seqlen], abs=0.051)
        assert (f.heads_q, f.heads_kv, f.batch, f.head_dim) == (64, 8, 1, 128)
    assert {r["device_name"] for r in records} == {"NVIDIA H100 80GB HBM3"}


def _figure(**changes):
    base = dict(
        source="a",
        kernel="fa3",
        mask="full",
        pass_="fwd",
        seqlen=8192,
        tflops=1.0,
        heads_q=64,
        heads_kv=8,
    )
    return Figure(**(base | changes))


def test_a_figure_is_the_call_it_timed():
    rate = load_profile("h100_nvlink_ib").rate("fa3")
    batched = figure_work(_figure(seqlen=512, batch=32, heads_q=16, heads_kv=16), rate)
    assert batched.flops == 4 * 512 * 512 * 128 * 16 * 32  # 4 S^2 d per head, times the batch
    assert (batched.mean_keys, batched.mean_queries, batched.rows) == (512, 512, 512)
    assert batched.runs == 0  # 512 rows fill four 128-row tiles exactly
    causal = figure_work(_figure(mask="causal", pass_="bwd"), rate)
    assert causal.flops == pytest.approx(2.5 * 4 * (8192 * 8193 / 2) * 128 * 64)
    assert causal.mean_keys == pytest.approx(8193 / 2) and causal.runs == 0
    # 1000 rows take eight 128-row tiles: 24 padded rows, whatever the model's unit for them
    ragged = figure_work(_figure(seqlen=1000, heads_q=16, heads_kv=16), rate)
    model = CostModel(load_profile("h100_nvlink_ib"), "fa3", 1)
    padded = ragged.rows + ragged.runs * (rate.tile_tokens(False, 1.0) - 1) / 2
    assert padded == pytest.approx(1024)
    assert model.compute_s(ragged, False) > 0
    # a backward figure must be whole 128-column key tiles, whose padding is then exactly none
    with pytest.raises(ValueError, match="seqlen=1000 is not a multiple of the key tile"):
        figure_work(_figure(seqlen=1000, pass_="bwd"), rate)


def test_the_fit_recovers_a_known_rate_and_a_second_builds_speed():
    """Figures made by a known rate (one source 12 % slower) give that rate back."""
    truth = load_profile("h100_nvlink_ib").with_values(
        {
            "kernels.fa3.fwd_tflops": 650.0,
            "kernels.fa3.half_keys": 400.0,
            "kernels.fa3.bwd_tflops": 520.0,
            "kernels.fa3.bwd_half_keys": 900.0,
            "kernels.fa3.call_us": 8.0,
        }
    )
    figures = []
    for pass_ in ("fwd", "bwd"):
        for seqlen in (1024, 8192, 32768):
            figures.append(_figure(source="ref", pass_=pass_, seqlen=seqlen))
        for seqlen in (512, 2048, 16384):
            figures.append(
                _figure(
                    source="other",
                    pass_=pass_,
                    seqlen=seqlen,
                    batch=16384 // seqlen,
                    heads_q=16,
                    heads_kv=16,
                )
            )
    speed = {"ref": 1.0, "other": 0.88}
    figures = [
        Figure(**{**f.__dict__, "tflops": predicted_tflops(f, truth) * speed[f.source]})
        for f in figures
    ]
    data = Figures("ref", None, {"ref": "", "other": ""}, figures)
    fit = fit_kernel(data, load_profile("h100_nvlink_ib"), "fa3")
    wanted = {"fwd_tflops": 650, "half_keys": 400, "bwd_tflops": 520, "bwd_half_keys": 900}
    for name, want in wanted.items():
        assert fit.values[f"kernels.fa3.{name}"] == pytest.approx(want, rel=0.01), name
    assert fit.values["kernels.fa3.call_us"] == pytest.approx(8.0, rel=0.05)
    for pass_ in ("fwd", "bwd"):
        assert fit.scales[("other", pass_)] == pytest.approx(0.88, rel=0.01)
    assert fit.rms_log_error() < 1e-4


def _write(tmp_path: Path, series: list[dict], sources=("blog",)) -> Path:
    path = tmp_path / "figures.yaml"
    data = {"reference": "blog", "sources": {s: "x" for s in sources}, "series": series}
    path.write_text(yaml.safe_dump(data))
    return path


def test_bad_figure_files_name_what_is_wrong(tmp_path, capsys):
    series = {
        "source": "paper",
        "kernel": "fa3",
        "mask": "full",
        "pass": "fwd",
        "heads": [64, 8],
        "seqlen": [8192],
        "tflops": [600],
    }
    with pytest.raises(ValueError, match=r"source='paper' is not listed; valid: \['blog'\]"):
        load_figures(_write(tmp_path, [series]))
    uneven = series | {"source": "blog", "tflops": [600, 610]}
    with pytest.raises(ValueError, match="1 lengths, 2 values"):
        load_figures(_write(tmp_path, [uneven]))
    assert main(["--figures", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_the_command_prints_each_figure_beside_its_fit(tmp_path, capsys):
    series = [
        {
            "source": "blog",
            "kernel": "flex",
            "mask": m,
            "pass": p,
            "heads": [64, 8],
            "seqlen": [8192, 32768],
            "tflops": t,
        }
        for m, p, t in (("full", "fwd", [385, 391]), ("full", "bwd", [281, 288]))
    ]
    assert main(["--figures", str(_write(tmp_path, series))]) == 0
    out = capsys.readouterr().out
    assert "flex: rms log error" in out and "blog full bwd 32768" in out
    shown = float(out.split("blog full fwd 8192")[1].split("->")[1].split("(")[0])
    assert math.isclose(shown, 385, rel_tol=0.03)


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path, monkeypatch):
    """`python -m lcab.plan.kernel_figures | head` closes the pipe after a few lines; the
    command ends with 0 instead of a BrokenPipeError traceback."""
    series = [
        {
            "source": "blog",
            "kernel": "flex",
            "mask": "full",
            "pass": "fwd",
            "heads": [64, 8],
            "seqlen": [8192, 32768],
            "tflops": [385, 391],
        }
    ]
    sink = (tmp_path / "sink").open("w")

    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError

        def flush(self) -> None:
            pass

        def fileno(self) -> int:
            return sink.fileno()

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert main(["--figures", str(_write(tmp_path, series))]) == 0
    sink.close()
