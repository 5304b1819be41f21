"""The sweep's W&B workspace: what the dry-run JSON holds, the group it filters on, the errors.

Everything runs offline: W&B's folders and HOME live in tmp, no W&B key is set, and sockets are
refused, so a build or dry run that reached for the network would fail here.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from lcab.report.workspace import add_arguments, build_workspace, command, read_sweep

# wandb-workspaces 0.4.13 declares pydantic-v1 style `@validator`s; pydantic 2 warns once per
# class at import (PydanticDeprecatedSince20, a DeprecationWarning). Not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Pydantic V1 style `@validator` validators are deprecated:DeprecationWarning"
)

GROUP = "2026-11-23_10-00-00_abc123"
CELLS = (  # (kernel, cp, mask, world size)
    ("ranges", "none", "causal", 1),
    ("sdpa", "none", "document", 1),
    ("ranges", "ring", "causal", 4),
)
STATUS_KEYS = {"n_ok", "n_skipped", "n_error", "n_timeout", "n_oom", "n_numerics_mismatch"}


def make_sweep(root: Path, group: str | None = None, logger: str = "wandb") -> Path:
    """A sweep folder shaped like ``python -m lcab.main -m`` writes: job configs only."""
    sweep = root / "outputs" / "sweeps" / "2026-11-23" / "10-00-00_abc123"
    for num, (kernel, cp, mask, world) in enumerate(CELLS):
        job = sweep / f"{num}_cp={cp},kernel={kernel},mask={mask}" / ".hydra"
        job.mkdir(parents=True)
        cfg = {
            "kernel": {"name": kernel},
            "cp": {"name": cp, "balance": "zigzag"},
            "mask": {"name": mask, "seed": None},
            "topology": {"name": "auto", "nodes": 1, "devices_per_node": world},
            "logger": {"name": logger, "project": "lcab", "entity": None, "group": group}
            if logger == "wandb"
            else {"name": "none"},
            "problem": {"dtype": "auto", "device": "auto"},
        }
        OmegaConf.save(OmegaConf.create(cfg), job / "config.yaml")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    return sweep


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Any]]:
    """No W&B settings of the caller's, W&B's folders in tmp, and every socket refused."""
    for key in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        attempts.append(args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield attempts
    assert attempts == [], f"network was used: {attempts}"


def parse(*argv: str) -> argparse.Namespace:
    """The arguments as the ``lcab.report`` command line will parse them."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def panels(node: Any) -> list[dict[str, Any]]:
    """Every panel dict (one with a ``viewType``) anywhere in the JSON."""
    if isinstance(node, dict):
        found = [node] if "viewType" in node else []
        return found + [p for v in node.values() for p in panels(v)]
    if isinstance(node, list):
        return [p for v in node for p in panels(v)]
    return []


def filter_leaves(node: Any) -> list[tuple[str, str, str, Any]]:
    """Every runset filter leaf as (section, name, op, value)."""
    if isinstance(node, dict):
        if {"key", "op", "value"} <= node.keys() and isinstance(node["key"], dict):
            key = node["key"]
            return [(key["section"], key["name"], node["op"], node["value"])]
        return [leaf for v in node.values() for leaf in filter_leaves(v)]
    if isinstance(node, list):
        return [leaf for v in node for leaf in filter_leaves(v)]
    return []


def dry_run(tmp_path: Path, sweep: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "out" / "workspace.json"
    assert command(parse(str(sweep), "--entity", "me", "--dry-run", str(out), *extra)) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def line_plots(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [p["config"] for p in panels(data) if p["viewType"] == "Run History Line Plot"]


def test_dry_run_writes_the_standard_views(tmp_path, capsys):
    data = dry_run(tmp_path, make_sweep(tmp_path))
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "workspace.json")
    assert (data["entity"], data["project"], data["displayName"]) == ("me", "lcab", f"lcab {GROUP}")

    assert filter_leaves(data) == [("run", "group", "=", GROUP)]

    lines = line_plots(data)
    assert {c["xAxis"] for c in lines} == {"seqlen"}
    metrics = {m for c in lines for m in c["metrics"]}
    assert metrics == {
        "fwd_tflops",
        "bwd_tflops",
        "fwd_mem_peak_mib",
        "bwd_mem_peak_mib",
        "fwd_max_abs_err",
        "bwd_max_abs_err",
    }
    # throughput: each pass grouped by kernel, by CP strategy and (two masks here) by mask
    for metric in ("fwd_tflops", "bwd_tflops"):
        groups = {c["groupBy"] for c in lines if c["metrics"] == [metric]}
        assert groups == {"kernel.value", "cp.value", "mask.value"}
    assert all(c["aggregate"] and c["groupAgg"] == "max" for c in lines)

    scatters = [p["config"] for p in panels(data) if p["viewType"] == "Scatter Plot"]
    axes = {(c["xAxis"], c["yAxis"]) for c in scatters}
    assert ("config:world_size.value", "summary:headline/fwd_tflops") in axes
    assert ("config:world_size.value", "summary:headline/bwd_tflops") in axes

    bars = [p["config"] for p in panels(data) if p["viewType"] == "Bar Chart"]
    assert bars and all(set(c["metrics"]) == STATUS_KEYS for c in bars)
    assert {c["groupBy"] for c in bars} == {"kernel.value", "cp.value"}

    settings = data["spec"]["section"]["settings"]
    assert settings["maxRuns"] >= len(CELLS)  # every cell's run is fetched for the groups


def test_runs_table_pins_the_axes_and_status_counts(tmp_path):
    data = dry_run(tmp_path, make_sweep(tmp_path))
    (runset,) = data["spec"]["section"]["runSets"]
    pinned = {k for k, on in runset["runFeed"]["columnPinned"].items() if on}
    assert {"config:kernel.value", "config:world_size.value", "summary:headline/fwd_tflops"} <= (
        pinned
    )
    assert {f"summary:{k}" for k in STATUS_KEYS} <= pinned
    assert runset["grouping"] == []  # the panels' own grouping is the only one


def test_sweep_group_is_the_dated_sweep_folder(tmp_path):
    assert read_sweep(make_sweep(tmp_path)).group == GROUP


def test_logger_group_of_the_cells_wins(tmp_path):
    sweep = make_sweep(tmp_path, group="mygroup")
    assert read_sweep(sweep).group == "mygroup"
    data = dry_run(tmp_path, sweep)
    assert filter_leaves(data) == [("run", "group", "=", "mygroup")]
    assert data["displayName"] == "lcab mygroup"


@pytest.mark.parametrize("group", ["it's", "a\\b", "g = 1"])
def test_a_group_the_library_would_mangle_is_refused(tmp_path, group):
    # wandb-workspaces round-trips filters through a naively quoted string
    with pytest.raises(ValueError, match="cannot filter on"):
        build_workspace(make_sweep(tmp_path, group=group), "me", "lcab", name="plain")


def test_a_name_w_and_b_refuses_is_an_error_that_says_so(tmp_path, capsys):
    out = tmp_path / "ws.json"
    sweep = str(make_sweep(tmp_path))
    assert command(parse(sweep, "--entity", "me", "--dry-run", str(out), "--name", "a = b")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--name" in err
    assert not out.exists()


def test_a_single_runs_folder_is_its_own_group(tmp_path):
    run = tmp_path / "outputs" / "runs" / "2026-11-23" / "11-00-00_def456"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("mask:\n  name: causal\nlogger:\n  name: none\n")
    assert read_sweep(run).group == "2026-11-23_11-00-00_def456"


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_a_folder_that_is_not_a_sweep_is_named(tmp_path, capsys, where):
    bad = tmp_path / where
    if where == "empty":
        bad.mkdir()
    with pytest.raises(ValueError, match=re.escape(str(bad)) + ".*expected an lcab sweep folder"):
        read_sweep(bad)
    assert command(parse(str(bad), "--entity", "me", "--dry-run", str(tmp_path / "x.json"))) == 2
    assert str(bad) in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_an_unreadable_job_config_is_named(tmp_path):
    sweep = make_sweep(tmp_path)
    broken = next(sweep.glob("*/.hydra/config.yaml"))
    broken.write_text("kernel: [unclosed\n")
    with pytest.raises(ValueError, match=re.escape(f"{broken}: unreadable")):
        read_sweep(sweep)


def test_a_job_folder_is_refused_for_its_sweep(tmp_path):
    sweep = make_sweep(tmp_path)
    job = next(p for p in sweep.iterdir() if p.is_dir())
    with pytest.raises(ValueError, match="pass the sweep"):
        read_sweep(job)


def test_a_mask_view_filters_to_that_mask(tmp_path):
    data = dry_run(tmp_path, make_sweep(tmp_path), "--mask", "causal")
    assert sorted(filter_leaves(data)) == [
        ("config", "mask", "=", "causal"),
        ("run", "group", "=", GROUP),
    ]
    assert "mask.value" not in {c.get("groupBy") for c in line_plots(data)}
    assert data["displayName"] == f"lcab {GROUP}, mask causal"
    with pytest.raises(ValueError, match="no mask 'full'"):
        build_workspace(make_sweep(tmp_path / "other"), "me", "lcab", mask="full")


def test_name_and_project_arguments(tmp_path):
    data = dry_run(tmp_path, make_sweep(tmp_path), "--name", "mine", "--project", "p2")
    assert (data["displayName"], data["project"]) == ("mine", "p2")


def test_entity_comes_from_the_environment_or_is_asked_for(tmp_path, monkeypatch, capsys):
    sweep = make_sweep(tmp_path)
    out = tmp_path / "ws.json"
    assert command(parse(str(sweep), "--dry-run", str(out))) == 2
    assert "--entity" in capsys.readouterr().err
    monkeypatch.setenv("WANDB_ENTITY", "team")
    assert command(parse(str(sweep), "--dry-run", str(out))) == 0
    assert json.loads(out.read_text())["entity"] == "team"


def test_a_sweep_without_wandb_cells_gets_a_note(tmp_path, capsys):
    dry_run(tmp_path, make_sweep(tmp_path, logger="none"))
    assert "no cell" in capsys.readouterr().err


def test_saving_without_credentials_says_how_to_log_in(tmp_path, capsys):
    start = time.monotonic()
    assert command(parse(str(make_sweep(tmp_path)), "--entity", "me")) == 1
    assert time.monotonic() - start < 30  # no prompt, no retries: the import of wandb dominates
    err = capsys.readouterr().err
    assert "wandb login" in err and "WANDB_API_KEY" in err and "--dry-run" in err


def test_a_failed_save_is_one_line(tmp_path, capsys, monkeypatch):
    import wandb_workspaces.workspaces as ws

    def fail(self: Any) -> None:
        raise ConnectionError("server unreachable\ntraceback noise")

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(ws.Workspace, "save", fail)
    assert command(parse(str(make_sweep(tmp_path)), "--entity", "me")) == 1
    err = capsys.readouterr().err.strip()
    assert err == "lcab: saving the workspace to W&B failed (ConnectionError: server unreachable)"


def test_a_save_prints_the_workspace_url(tmp_path, capsys, monkeypatch):
    import wandb_workspaces.workspaces as ws

    saved: list[str] = []

    def save(self: Any) -> Any:
        saved.append(self.name)
        return self

    url = "https://wandb.example/me/lcab?nw=abc"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(ws.Workspace, "save", save)
    monkeypatch.setattr(ws.Workspace, "url", property(lambda self: url))
    assert command(parse(str(make_sweep(tmp_path)), "--entity", "me")) == 0
    assert saved == [f"lcab {GROUP}"]
    assert capsys.readouterr().out.strip() == url
