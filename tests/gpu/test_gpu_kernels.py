"""The GPU tier (marker ``gpu``): every kernel that runs on CUDA × every mask × fwd/bwd vs fp64.

Only a machine with CUDA runs it (elsewhere one test reports the skip and its reason). Each case
follows flash-attn's own acceptance rule: per tensor, the kernel's error against the fp64
reference must be at most twice (backward: three times) the error of a plain PyTorch attention
computed in the kernel's own precision, plus 1e-5 — so half-precision kernels are judged
against what half precision can do, not against an fp64 tolerance. A case the kernel declares
unsupported is skipped with its reasons (a missing package, an old version, an unsupported mask),
which is also checked: a declared capability must really run.

With ``LCAB_GPU_VERIFICATION=<file>`` every case appends one JSON line (kernel, mask, pass,
verdict, errors or reason, versions, GPU name) — the raw material of the GPU verification table
that `launchers/gpu_check.sh` writes. Nothing else may write that table.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest
import torch

from lcab.cell import torch_dtype
from lcab.kernels import KERNELS, Problem, get_kernel
from lcab.masks import get_pattern, list_masks, make_mask
from tests.helpers.cli import read_jsonl, run_lcab
from tests.helpers.run_if import run_if

pytestmark = pytest.mark.gpu

CUDA = torch.cuda.is_available()
S, HQ, D = 1000, 8, 64  # S not a multiple of 128: tile edges are where kernels break
DOCS = {"doc_source": "uniform", "min_doc_len": 37, "max_doc_len": 300}
PARAMS = {
    "block_causal_document": {"block_size": 40},  # must divide S
    "sliding_window": {"window": 129},
    "sliding_window_causal": {"window": 129},
    "global_sliding_window": {"window": 129, "global_tokens": 33},
    "block_sparse": {"block_size": 128},
    "varblock_sparse": {"avg_block_size": 160, "min_block_size": 64},
    "prefix_lm_causal": {"prefix": 300},
}
CHOSEN = [k for k in os.environ.get("LCAB_GPU_KERNELS", "").split(",") if k]
"""``LCAB_GPU_KERNELS=a,b`` (launchers/gpu_check.sh) narrows the tier to one call's kernels."""
CUDA_KERNELS = [
    n
    for n in KERNELS.names()
    if "cuda" in get_kernel(n).caps.devices and (not CHOSEN or n in CHOSEN)
]
CASES = [(k, m) for k in CUDA_KERNELS for m in list_masks()] if CUDA else []


@run_if(cuda=True)
def test_the_gpu_tier_has_a_cuda_device():
    assert torch.cuda.device_count() >= 1 and CASES


#: Kernels computing whole tiles of another size than the block_sparse default (128).
TILE = {"sparse_vsa": 64, "sparse_vsa_triton": 64}


def _mask(name: str, heads_kv: int, kernel: str = ""):
    params = dict(PARAMS.get(name, {}))
    if name == "block_sparse" and kernel in TILE:  # drawn on the kernel's own grid
        params["block_size"] = TILE[kernel]
    accepted = set(get_pattern(name).param_names())
    if "heads" in accepted:
        params["heads"] = heads_kv
    if "doc_source" in accepted:
        params.update(DOCS)
    return make_mask(name, S, seed=11, **params)


def _attention(q, k, v, dense: torch.Tensor):
    """Plain attention in the inputs' own precision (the same-precision yardstick)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~dense, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)
    probs = torch.exp(scores.float() - lse[..., None]).nan_to_num(0.0).to(q.dtype)
    return torch.einsum("hqk,khd->qhd", probs, v), lse


def _max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    finite = torch.isfinite(ref)
    return float((x[finite] - ref[finite]).abs().max()) if finite.any() else 0.0


def _record(kernel_name: str, mask_name: str, pass_: str, verdict: str, **fields) -> None:
    out = os.environ.get("LCAB_GPU_VERIFICATION")
    if not out:
        return
    kernel = get_kernel(kernel_name)
    package = kernel.caps.package
    line = {
        "kernel": kernel_name,
        "mask": mask_name,
        "pass": pass_,
        "verdict": verdict,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "package": package,
        "package_version": _version(package, kernel.caps.requires),
        "python": platform.python_version(),
        **fields,
    }
    with Path(out).open("a") as fh:
        fh.write(json.dumps(line, default=str) + "\n")


def _version(package: str | None, probe=None) -> str | None:
    """The installed distribution's version: the adapter's probe knows its distribution names
    (``flash-attn-4`` for ``flash_attn.cute``), else the import name is tried as one."""
    if package is None:
        return None
    from importlib import metadata

    names = tuple(probe.distributions) if probe is not None else ()
    for dist in (*names, package, package.replace("_", "-")):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
@pytest.mark.parametrize(("kernel_name", "mask_name"), CASES)
def test_kernel_on_cuda_is_as_accurate_as_its_precision_allows(kernel_name, mask_name, pass_):
    kernel = get_kernel(kernel_name)
    caps = kernel.caps
    dtype = torch_dtype("bfloat16" if "bfloat16" in caps.dtypes else min(caps.dtypes))
    hkv = 2 if caps.gqa else HQ
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v, dout = (
        torch.randn(S, h, D, generator=gen, device="cuda", dtype=dtype) for h in (HQ, hkv, hkv, HQ)
    )
    mask = _mask(mask_name, hkv, kernel_name)
    problem = Problem.of(q, k)
    reasons = kernel.not_supported_reasons(problem, mask, pass_)
    if reasons:
        _record(kernel_name, mask_name, pass_, "unsupported", reason="; ".join(reasons))
        pytest.skip("; ".join(reasons))
    dense = mask.to_dense().to("cuda")
    dense = dense if dense.dim() == 3 else dense.unsqueeze(0)
    dense = dense.repeat_interleave(HQ // dense.shape[0], dim=0)
    try:
        prepared = kernel.prepare(mask, problem)
        if pass_ == "fwd":
            with torch.no_grad():
                out, lse = prepared.run(
                    prepared.to_native(q), prepared.to_native(k), prepared.to_native(v)
                )
            got = {"out": prepared.from_native(out)}
            if lse is not None:
                got["lse"] = prepared.lse_from_native(lse)
            same_out, same_lse = _attention(q, k, v, dense)
            same = {"out": same_out, "lse": same_lse}
            ref_out, ref_lse = _attention(q.double(), k.double(), v.double(), dense)
            ref = {"out": ref_out, "lse": ref_lse}
            factor = 2.0
        else:
            leaves = [prepared.to_native(t).detach().requires_grad_(True) for t in (q, k, v)]
            out, _ = prepared.run(*leaves)
            out.backward(prepared.to_native(dout))
            got = {
                n: prepared.from_native(t.grad)
                for n, t in zip(("dq", "dk", "dv"), leaves, strict=True)
            }
            same, ref = ({}, {})
            for precision, into in ((dtype, same), (torch.float64, ref)):
                ls = [t.detach().to(precision).requires_grad_(True) for t in (q, k, v)]
                o, _ = _attention(*ls, dense)
                grads = torch.autograd.grad(o, ls, dout.to(precision))
                into.update(zip(("dq", "dk", "dv"), grads, strict=True))
            factor = 3.0
        torch.cuda.synchronize()
    except Exception as err:
        _record(kernel_name, mask_name, pass_, "failed", error=f"{type(err).__name__}: {err}"[:500])
        raise
    errors = {n: _max_err(got[n], ref[n]) for n in got}
    bounds = {n: factor * _max_err(same[n], ref[n]) + 1e-5 for n in got}
    failed = {n: (errors[n], bounds[n]) for n in got if not errors[n] <= bounds[n]}
    _record(
        kernel_name,
        mask_name,
        pass_,
        "failed" if failed else "verified",
        errors=errors,
        bounds=bounds,
    )
    assert not failed, f"error above flash-attn's bound (error, bound): {failed}"


@pytest.mark.parametrize("kernel_name", CUDA_KERNELS if CUDA else [])
def test_one_timed_cell_per_kernel_on_cuda(kernel_name, tmp_path):
    """The whole app on the GPU: CUDA events, L2 flush, allocator peak, numerics, one record."""
    done = run_lcab(
        f"kernel={kernel_name}",
        "mask=causal_document",
        "problem.device=cuda",
        "problem.dtype=bfloat16",
        "seqlen.values=[4096]",
        "bench=quick",
        "bench.progress=false",
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = read_jsonl(tmp_path / "records.jsonl")
    if record["status"] == "skipped":
        pytest.skip("; ".join(record["reasons"]))
    assert record["status"] == "ok", record["reasons"]
    assert record["device"] == "cuda" and record["device_name"]
    assert record["fwd"]["ms_p50"] > 0 and record["fwd"]["mem_peak_mib"] > 0
