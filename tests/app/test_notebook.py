"""``notebooks/compare.ipynb`` runs top to bottom on a real tiny sweep and computes the right table.

The notebook is executed in a real Jupyter kernel (nbclient); a check cell appended by the test
compares what the notebook computed with the records read here directly.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers.cli import ROOT, read_jsonl, run_lcab

NOTEBOOK = ROOT / "notebooks" / "compare.ipynb"

pytestmark = pytest.mark.slow


def test_the_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_the_notebook_runs_on_a_tiny_sweep_and_its_headline_matches_the_records(
    tmp_path, monkeypatch
):
    sweep = tmp_path / "sweep"
    done = run_lcab(
        "-m",
        "kernel=ranges,sdpa",
        "mask=causal",
        "seqlen.values=[128,256]",
        "bench=quick",
        "bench.progress=false",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(sweep / "records.jsonl")
    expected = {r["kernel"]: r["fwd"]["tflops"] for r in records if r["seqlen"] == 256}
    assert set(expected) == {"ranges", "sdpa"} and all(v > 0 for v in expected.values())

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(
        nbformat.v4.new_code_cell(
            f"expected = {json.dumps(expected)}\n"
            "assert len(df) == 4, len(df)\n"
            "got = dict(zip(headline['series'], headline['fwd_tflops']))\n"
            "assert set(headline['seqlen']) == {256}, headline\n"
            "assert got.keys() == expected.keys(), got\n"
            "assert all(abs(got[k] - v) <= 1e-12 * v for k, v in expected.items()), got\n"
            "assert status_counts.loc[('ranges', 'causal'), 'ok'] == 2\n"
            "assert headline['fwd_speedup'].min() == 1.0\n"
            "print('notebook checks passed')"
        )
    )
    monkeypatch.setenv("LCAB_SWEEP", str(sweep))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend draws
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    client = NotebookClient(
        nb, kernel_name="python3", timeout=180, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    last = nb.cells[-1].outputs
    assert any("notebook checks passed" in o.get("text", "") for o in last), last
    figures = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/png" in o.get("data", {})
    ]
    assert len(figures) == 1  # the throughput figure (no CP records: the CP cell prints instead)
