"""The planner's shortcuts change no answer: each is held to the long way round.

A 25-job planner sweep and a 96-rank recommendation were made faster by not counting band-edge
rows for kernels that do not pay for them, by computing a mask's per-row work once, by parsing
each config file once per process, and by replaying a recommendation's candidates on every core.
"""

from __future__ import annotations

import numpy as np
import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from lcab.config import CONF_DIR, compose_cache, register_configs
from lcab.cp import STRATEGIES
from lcab.cp.balance import row_work
from lcab.masks import make_mask
from lcab.plan import recommend as recommend_module
from lcab.plan.hardware import load_profile
from lcab.plan.model import predict_pass
from lcab.plan.predict import PlanCell, mask_for, predict
from lcab.plan.recommend import candidates, median_step, recommend, step_ms
from lcab.plan.replay import replay


def _cell(**changes) -> PlanCell:
    """The H100 problem (64:8 heads of 128, bf16) on one node of 8."""
    base = PlanCell("ring", "fa3", "causal_document", 16384, 1, 8, 64, 8, 128, "bfloat16")
    return base.with_(**changes)


def test_without_band_edges_a_kernel_that_ignores_them_is_costed_the_same():
    cell = _cell(cp="ring", cp_options={"balance": "zigzag"})
    strategy = STRATEGIES.get("ring")({"balance": "zigzag"}, cell.devices_per_node)
    mask = mask_for(cell)
    full = replay(strategy, mask, cell.problem(), cell.world)
    lean = replay(strategy, mask, cell.problem(), cell.world, diagonal=False)
    rows = [w.diagonal_rows for r in full.passes["fwd"] for win in r for s in win.stages
            for w in s.calls]  # fmt: skip
    assert max(rows) > 0  # the mask has edges: the shortcut skips real work
    lean_rows = {w.diagonal_rows for r in lean.passes["fwd"] for win in r for s in win.stages
                 for w in s.calls}  # fmt: skip
    assert lean_rows == {0.0}
    h100 = load_profile("h100_nvlink_ib")
    assert h100.rate("fa3").diagonal_rows == 0
    for pass_ in ("fwd", "bwd"):
        assert predict_pass(lean, h100, "fa3", pass_) == predict_pass(full, h100, "fa3", pass_)
    # a kernel whose rate does pay for them still gets them through `predict`
    cpu = load_profile("cpu_gloo_local")
    assert cpu.rate("ranges").diagonal_rows > 0
    small = cell.with_(kernel="ranges", seqlen=4096, devices_per_node=4)
    want = predict_pass(
        replay(strategy, mask_for(small), small.problem(), small.world), cpu, "ranges", "fwd"
    )
    assert predict(small, cpu).fwd == want


def test_a_masks_row_work_is_computed_once_and_cannot_be_changed():
    mask = make_mask("causal_document", 4096, seed=3)
    same = make_mask("causal_document", 4096, seed=3)  # another object, equal content
    work = row_work(mask)
    assert row_work(same) is work
    assert work.sum() == mask.area()
    with pytest.raises(ValueError, match="read-only"):
        work[0] = 1.0
    other = make_mask("causal_document", 4096, seed=4)
    assert row_work(other).sum() == other.area() and row_work(other) is not work


def test_each_config_file_is_parsed_once_per_process(monkeypatch):
    register_configs()
    compose_cache.install()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            first = ["kernel=sdpa", "topology=2x8"]
            want = loader.load_configuration(config_name="config", overrides=first,
                                             run_mode=RunMode.RUN)  # fmt: skip

            def no_parsing(*args, **kwargs):
                raise AssertionError("a config file was parsed again")

            monkeypatch.setattr(OmegaConf, "load", no_parsing)
            # another job (another memo key) over the same files: every file from memory
            again = loader.load_configuration(config_name="config", overrides=first[::-1],
                                              run_mode=RunMode.RUN)  # fmt: skip
            assert again.topology == want.topology and again.kernel == want.kernel
            again.kernel.name = "changed"  # each caller has its own copy
            third = loader.load_configuration(config_name="config", overrides=first[::-1],
                                              run_mode=RunMode.RUN)  # fmt: skip
            assert third.kernel.name == want.kernel.name
    finally:
        GlobalHydra.instance().clear()


def test_a_recommendation_on_every_core_ranks_as_one_process_would(monkeypatch):
    hardware = load_profile("h100_nvlink_ib")
    cell = _cell(cp="usp", seqlen=65536)
    ranked = recommend(cell, hardware).ranked
    serial = sorted(
        (median_step(c, hardware, [mask_for(cell)]) for c in candidates(cell)), key=step_ms
    )
    assert [p.cell for p in ranked] == [p.cell for p in serial]
    assert [step_ms(p) for p in ranked] == [step_ms(p) for p in serial]
    # and the cores were asked for: the map is the module's, with every core
    calls = []
    real = recommend_module.fork_map
    monkeypatch.setattr(
        recommend_module,
        "fork_map",
        lambda f, items, workers: calls.append(workers) or real(f, items, workers),
    )
    recommend(cell, hardware)
    assert calls == [recommend_module.usable_cores()]
    assert np.isfinite(step_ms(ranked[0]))
