"""Every config option composes and resolves; the registries and conf/ agree; bad input fails."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from lcab.config import CONF_DIR, cp_config_classes
from lcab.config.preflight import check_jobs, job_overrides
from lcab.config.resolve import ConfigError, resolve_cell
from lcab.kernels import KERNELS
from lcab.masks import list_masks
from lcab.masks.patterns import MASK_PATTERNS

GROUPS = [
    "kernel",
    "cp",
    "mask",
    "seqlen",
    "topology",
    "bench",
    "logger",
    "launcher",
    "experiment",
    "sweep",
    "debug",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


# A kernel that composes everywhere: ranges until the default kernel exists everywhere
BASE = ["kernel=naive"]


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(compose, group):
    found = options(group)
    assert found, f"conf/{group} has no options"
    for option in found:
        prefix = "+" if group in ("sweep",) else ""
        overrides = [*([] if group == "kernel" else BASE), f"{prefix}{group}={option}"]
        if group == "cp" and option != "none":
            overrides.append("topology=local4")
        if group == "topology" and option not in ("auto", "single"):
            overrides.append("cp=ring")  # several ranks need a CP strategy
        cfg = compose(overrides, hydra=True)
        if group in ("launcher", "sweep"):
            continue  # they configure Hydra itself, checked by the composition above
        cell = resolve_cell(cfg)
        if group == "kernel":
            assert cell.kernel == option
        elif group == "mask":
            assert cell.mask == MASK_PATTERNS.canonical(option)
        elif group == "cp":
            assert cell.cp == option


def test_registries_and_conf_agree():
    assert set(options("kernel")) == set(KERNELS.names())
    assert set(options("mask")) == set(list_masks()) | set(MASK_PATTERNS.aliases())
    assert set(options("cp")) == set(cp_config_classes())


def test_mask_parameters_are_config_fields(compose):
    for name in list_masks():
        cfg = compose([*BASE, f"mask={name}"])
        fields = set(OmegaConf.to_container(cfg.mask)) - {"name", "seed"}
        assert fields == set(MASK_PATTERNS.get(name).param_names())


def test_defaults_resolve_to_cpu_problem(compose):
    cell = resolve_cell(compose([*BASE, "problem.device=cpu"]))
    assert (cell.heads_q, cell.heads_kv, cell.head_dim, cell.dtype) == (8, 2, 64, "float32")
    assert cell.world_size == 1 and cell.seqlens == (1024, 2048, 4096, 8192)


def test_mask_heads_default_to_kv_heads(compose):
    cell = resolve_cell(
        compose(
            [
                *BASE,
                "mask=block_sparse",
                "problem.heads_kv=4",
                "problem.heads_q=8",
                "problem.device=cpu",
            ]
        )
    )
    assert cell.mask_params["heads"] == 4
    assert cell.mask_samples == 3  # random pattern: bench.mask_samples


def test_deterministic_masks_are_drawn_once(compose):
    assert resolve_cell(compose([*BASE, "mask=causal"])).mask_samples == 1
    assert (
        resolve_cell(compose([*BASE, "mask=document", "mask.doc_source=fixed"])).mask_samples == 1
    )


def test_per_device_seqlen_scales_with_world(compose):
    cell = resolve_cell(
        compose([*BASE, "cp=ring", "topology=2x4", "seqlen=per_device_8k", "problem.device=cpu"])
    )
    assert cell.world_size == 8 and cell.seqlens == (8192 * 8,)
    assert cell.seqlen_per_device == (8192,)


def test_a_subset_of_lengths_keeps_each_per_device_value_with_its_total(compose):
    cell = resolve_cell(
        compose(
            [
                *BASE,
                "cp=ring",
                "topology=local4",
                "seqlen.per_device=true",
                "seqlen.values=[1024,2048,4096]",
                "problem.device=cpu",
            ]
        )
    )
    subset = cell.with_seqlens([4 * 4096, 4 * 1024])
    assert subset.seqlens == (16384, 4096)
    assert subset.seqlen_per_device == (4096, 1024)
    assert cell.with_seqlens([]).seqlens == ()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["problem.heads_q=6", "problem.heads_kv=4"], "problem.heads_q"),
        (["problem.head_dim=-1"], "problem.head_dim"),
        (["problem.heads_kv=0"], "problem.heads_kv"),
        (["seqlen.values=[0]"], "seqlen.values"),
        (["seqlen.values=[]"], "seqlen.values"),
        (["bench.passes=[sideways]"], "bench.passes"),
        (["bench.reps=0"], "bench.reps"),
        (["bench.quantiles=[0.2,0.8]"], "bench.quantiles"),
        (["bench.telemetry_interval_ms=0"], "bench.telemetry_interval_ms"),
        (["problem.dtype=float8"], "problem.dtype"),
        (["problem.device=tpu"], "problem.device"),
        (["mask=sliding_window", "mask.window=-1"], "mask"),
        (["mask=block_causal_document", "seqlen.values=[1000]"], "mask"),
        (["mask=block_sparse", "mask.density=1.5"], "mask"),
        (["topology=local4"], "topology"),
    ],
)
def test_invalid_values_name_the_key(compose, overrides, key):
    with pytest.raises(ConfigError) as info:
        resolve_cell(compose([*BASE, *overrides]))
    assert info.value.key.startswith(key)
    assert str(info.value).startswith(key)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["kernel=nosuch"], "kernel=nosuch: no kernel named 'nosuch'; valid: cudnn, fa2"),
        (["mask=nosuch"], "mask=nosuch: no mask named 'nosuch'; valid: block_causal_document"),
        (["seqlen=nosuch"], "seqlen=nosuch: no seqlen named 'nosuch'; valid: frontier, long"),
        (
            ["mask=sliding_window", "mask.windw=3"],
            "did you mean mask.window? valid keys of mask sliding_window: name, seed, window",
        ),
        (["mask=sliding_window", "mask.window=wide"], "could not be converted to Integer"),
        (["problem.heads_q=6", "problem.heads_kv=4"], "multiple of problem.heads_kv=4"),
    ],
)
def test_preflight_reports_every_bad_job(overrides, expected):
    problems = check_jobs([*BASE, *overrides], multirun=False)
    assert len(problems) == 1 and expected in problems[0]


def test_preflight_expands_a_sweep_and_checks_each_job():
    jobs = job_overrides(["-m" if False else "kernel=naive,sdpa", "mask=causal,full"], True)
    assert sorted(map(tuple, jobs)) == sorted(
        [(f"kernel={k}", f"mask={m}") for k in ("naive", "sdpa") for m in ("causal", "full")]
    )
    problems = check_jobs(["kernel=naive,nosuch", "mask=causal"], multirun=True)
    assert len(problems) == 1 and "nosuch" in problems[0]


def test_a_sweep_over_cp_options_is_told_to_force_the_option_key():
    # cp=none (the default) has no ulysses_degree; the sweep's jobs (usp, loongtrain) do
    problems = check_jobs(["cp=usp,loongtrain", "cp.ulysses_degree=2"], multirun=True)
    assert len(problems) == 1 and "++cp.ulysses_degree=..." in problems[0]
    assert check_jobs(["cp=usp,loongtrain", "++cp.ulysses_degree=2"], multirun=True) == []


def test_sweep_preset_params_expand():
    jobs = job_overrides([*BASE, "+sweep=cp_strategies"], multirun=True)
    assert len(jobs) == 5 * 3
