"""Support matrices generated from the registries, never written by hand.

kernel x mask x pass (each kernel on its *home* problem: CPU defaults if it runs on CPU, else
the paper's GPU shape, with this machine's circumstances left out), strategy x mask (CPU local
kernels at world 4) and strategy x GPU kernel (masks each runs at world 4). Cells come from
`Kernel.not_supported_reasons` and `Strategy.not_supported_reasons`, the checks the runner uses,
so a matrix cannot drift from what the runner skips.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lcab.cell import torch_dtype
from lcab.config.resolve import CPU_PROBLEM, GPU_PROBLEM
from lcab.cp.base import STRATEGIES
from lcab.kernels import KERNELS, Kernel, Problem, get_kernel
from lcab.kernels.base import proof_on_cpu
from lcab.kernels.registry import gpu_compared
from lcab.masks import get_pattern, list_masks, make_mask
from lcab.masks.core import AttnMask
from lcab.masks.patterns import MASK_PATTERNS
from lcab.masks.patterns.base import DocParams

MATRIX_SEQLEN = 8192
"""Length the masks are built at (block_causal_document's 1024-token blocks divide it)."""
CP_WORLD = 4
"""World size of the strategy matrix (the CPU default for cp != none)."""
SHOWN_PASSES = ("fwd", "bwd")
"""Passes the matrices show (fwd_bwd runs whenever both do)."""
VERIFICATION_FILE = (
    Path(__file__).resolve().parents[2] / "notebooks" / "data" / "gpu_verification.jsonl"
)
"""The committed GPU verification records (written only by ``launchers/gpu_check.sh`` on a GPU
machine); the support matrix's GPU-verified marks come from here and nowhere else."""
EVIDENCE = {"verified": "G", "failed": "G!"}
"""Marks of a GPU run's verdict on a supported pass."""


def gpu_verdicts(path: Path = VERIFICATION_FILE) -> dict[tuple[str, str, str], str]:
    """(kernel, mask, pass) -> verdict of the committed GPU run ({} when none is committed)."""
    if not path.exists():
        return {}
    from lcab.report.gpu_verification import read_verification

    return {(r["kernel"], r["mask"], r["pass"]): r["verdict"] for r in read_verification(path)}


def evidence(
    kernel: Kernel, mask_name: str, verdict: Verdict, gpu: dict[tuple[str, str, str], str]
) -> str:
    """What backs a supported cell beyond the declaration, per shown pass (`EVIDENCE`).

    CPU kernels: nothing (the suite runs them against the reference); CUDA-only ones: ``c``
    CPU contract-tested, ``G``/``G!`` verified/failed by the committed GPU run, ``n`` nothing.
    """
    if "cpu" in kernel.caps.devices or not verdict.passes:
        return ""
    marks = []
    for pass_ in verdict.passes:
        mark = EVIDENCE.get(gpu.get((kernel.name, mask_name, pass_), ""), "")
        marks.append(mark or ("c" if kernel.caps.contract_tested else "n"))
    return marks[0] if len(set(marks)) == 1 else "/".join(marks)


@dataclass(frozen=True)
class Verdict:
    """One cell: which passes run, and why the others do not."""

    passes: tuple[str, ...]
    reasons: tuple[str, ...]

    @property
    def text(self) -> str:
        """``fwd+bwd``, ``fwd`` or ``-``."""
        return "+".join(self.passes) if self.passes else "-"


def home_problem(kernel: Kernel, heads_kv: int | None = None, gpu: bool = False) -> Problem:
    """CPU defaults if the kernel runs on CPU (and not ``gpu``), else the GPU shape on CUDA."""
    on_cpu = "cpu" in kernel.caps.devices and not gpu
    shape: dict[str, Any] = CPU_PROBLEM if on_cpu else GPU_PROBLEM
    if not kernel.caps.gqa:  # judged on MHA (the paper's 64:64 runs), not refused for GQA
        shape = {**shape, "heads_kv": shape["heads_q"]}
    return Problem(
        MATRIX_SEQLEN,
        MATRIX_SEQLEN,
        int(shape["heads_q"]),
        int(heads_kv or shape["heads_kv"]),
        int(shape["head_dim"]),
        torch_dtype(str(shape["dtype"])),
        torch.device("cpu" if on_cpu else "cuda"),
    )


def matrix_mask(name: str, heads_kv: int) -> AttnMask:
    """The mask ``name`` at `MATRIX_SEQLEN` (per-head masks get one slice set per KV head)."""
    params = {"heads": heads_kv} if "heads" in get_pattern(name).param_names() else {}
    return make_mask(name, MATRIX_SEQLEN, seed=0, **params)


def kernel_verdict(kernel: Kernel, mask_name: str) -> Verdict:
    """What ``kernel`` can run for ``mask_name`` on its home problem."""
    problem = home_problem(kernel)
    mask = matrix_mask(mask_name, problem.heads_kv)
    machine = set(kernel.environment_reasons(problem.device))
    runs, why = [], []
    for pass_ in SHOWN_PASSES:
        reasons = [
            r for r in kernel.not_supported_reasons(problem, mask, pass_) if r not in machine
        ]
        if reasons:
            why += [r for r in reasons if r not in why]
        else:
            runs.append(pass_)
    return Verdict(tuple(runs), tuple(why))


def strategy_kernels(strategy: str, mask_name: str, pass_: str = "bwd") -> list[str]:
    """CPU kernels that run ``pass_`` (bwd implies fwd) under ``strategy`` for the mask."""
    names = []
    for name in KERNELS.names():
        kernel = get_kernel(name)
        if name == "reference" or "cpu" not in kernel.caps.devices:
            continue
        problem = home_problem(kernel)
        mask = matrix_mask(mask_name, problem.heads_kv)
        instance = STRATEGIES.get(strategy)({}, CP_WORLD)
        if not any(
            instance.not_supported_reasons(kernel, problem, mask, CP_WORLD, p)
            for p in ("fwd", pass_)
        ):
            names.append(name)
    return names


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


SYMBOLS = {("fwd", "bwd"): "✓", ("fwd",): "fwd", (): "–"}


def kernel_matrix_markdown() -> str:
    """Markdown: kernels (rows) x masks (columns); ✓ = fwd+bwd, ``fwd`` = forward only."""
    masks = list_masks()
    rows, notes = [], []
    gpu = gpu_verdicts()
    for name in KERNELS.names():
        kernel = get_kernel(name)
        home = "CPU" if "cpu" in kernel.caps.devices else "GPU"
        label = f"`{name}` ({home})"
        verdicts = {m: kernel_verdict(kernel, m) for m in masks}
        cells = [
            f"{SYMBOLS.get(v.passes, '?')} {evidence(kernel, m, v, gpu)}".strip()
            for m, v in verdicts.items()
        ]
        rows.append([label, *cells])
        by_reason: dict[str, list[str]] = {}
        for m, v in verdicts.items():
            for reason in v.reasons:
                by_reason.setdefault(_category(reason), []).append(m)
        if by_reason:
            parts = [
                f"{why} ({', '.join(sorted(set(ms), key=masks.index))})"
                if len(set(ms)) < len(masks)
                else why
                for why, ms in by_reason.items()
            ]
            notes.append(f"- `{name}`: " + "; ".join(parts))
    out = _table(["kernel"] + [f"`{m}`" for m in masks], rows)
    verified = sum(v == "verified" for v in gpu.values())
    out += [
        "",
        "Cells: `✓` forward and backward, `fwd` forward only, `–` unsupported (reasons below). "
        "CPU kernels' supported cells run in the test suite against the fp64 reference. For "
        "GPU kernels the mark after the passes says what backs them: `c` CPU contract-tested "
        "(the adapter's whole call path against a stand-in of the library's documented API, "
        "`tests/unit/test_adapter_*.py`; for `fa2`, flash-attn 2.8.3.post2's own Python over an "
        "emulated CUDA extension — which layers are real is in the kernels guide; not a GPU "
        "result), `G` GPU-verified and `G!` failed "
        "on a GPU, both only from the committed run of `launchers/gpu_check.sh` "
        "(`notebooks/data/gpu_verification.jsonl`), `n` not run anywhere yet (torch's own CUDA "
        "backends, no stand-in). GPU kernels without GQA are judged on 64:64 heads. "
        + (
            f"GPU-verified passes: {verified}."
            if gpu
            else "GPU-verified: none yet — no GPU run has been committed."
        ),
        "",
        "Why a cell is not ✓:",
        "",
        *notes,
    ]
    return "\n".join(out)


def _category(reason: str) -> str:
    """The stable part of a reason (drops the instance detail after the first colon)."""
    if reason.startswith("mask not expressible as"):
        return reason.split(":")[0]
    if reason.startswith("no per-KV-head masks"):
        return "no per-KV-head masks"
    if reason.startswith("SDPA's"):
        return reason.split(", not")[0]
    tiles = re.search(r"touched (\d+x\d+) tiles are only partly attended", reason)
    if tiles:  # block_grid.partial_tile_reason: the count and first tile are instance detail
        return f"computes whole {tiles.group(1)} tiles: the mask has partly attended ones"
    return reason


def strategy_matrix_markdown() -> str:
    """Markdown: strategies x masks; ✓ where all the row's CPU kernels run, else which do."""
    masks = list_masks()
    rows = []
    for strategy in STRATEGIES.names():
        per_mask = {m: strategy_kernels(strategy, m) for m in masks}
        common = sorted(set.union(*(set(k) for k in per_mask.values())))
        cells = [
            "✓"
            if per_mask[m] == [k for k in KERNELS.names() if k in common]
            else (", ".join(per_mask[m]) or "–")
            for m in masks
        ]
        rows.append([f"`{strategy}`", ", ".join(common), *cells])
    header = ["strategy", f"CPU local kernels (fwd+bwd, world {CP_WORLD})"]
    return "\n".join(_table(header + [f"`{m}`" for m in masks], rows))


def kernel_list_markdown() -> str:
    """Markdown: every registered kernel with its declared capabilities."""
    rows = []
    for name in KERNELS.names():
        kernel = get_kernel(name)
        caps = kernel.caps
        rows.append(
            [
                f"`{name}`",
                kernel.summary,
                "/".join(sorted(caps.devices)),
                "/".join(sorted(caps.backward_devices)) or "–",
                caps.lowering,
                "yes" if caps.per_head_masks else "no",
                "/".join(d for d in ("cpu", "cuda") if d in caps.devices and kernel.returns_lse(d))
                or "–",
                f"`{caps.package}`" if caps.package else "torch",
                proof_on_cpu(caps),
            ]
        )
    header = ["kernel", "what", "devices", "backward", "mask form", "per-head masks", "LSE on"]
    header += ["needs", "shown here"]
    return "\n".join(_table(header, rows))


def mask_list_markdown() -> str:
    """Markdown: every registered mask pattern, what it attends, its parameters (defaults)."""
    shared = {f.name for f in dataclasses.fields(DocParams)}
    rows = []
    for name in list_masks():
        pattern = get_pattern(name)
        fields = [f for f in dataclasses.fields(pattern.params_cls) if f.name not in shared]
        params = [f"`{f.name}`={f.default}" for f in fields]
        params += ["document parameters"] if pattern.uses_documents else []
        aliases = [a for a, canonical in MASK_PATTERNS.aliases().items() if canonical == name]
        label = f"`{name}`" + "".join(f" (alias `{a}`)" for a in aliases)
        rows.append([label, pattern.summary.replace("|", "\\|"), ", ".join(params) or "–"])
    return "\n".join(_table(["name", "attends", "parameters (defaults)"], rows))


def kernel_install_markdown() -> str:
    """Markdown: how to install each optional package, with its kernels; wheels before builds."""
    by_package: dict[str, list[str]] = {}
    for name in KERNELS.names():
        by_package.setdefault(KERNELS.get(name).caps.package or "", []).append(name)
    rows = [[", ".join(f"`{n}`" for n in by_package.pop("", [])), "torch", "nothing", "—"]]
    for package, names in by_package.items():
        requires = KERNELS.get(names[0]).caps.requires
        assert requires is not None  # grouped by it
        kernels = ", ".join(f"`{n}`" for n in names)
        rows.append([kernels, f"`{package}`", f"`{requires.install}`", requires.note])
    rows[1:] = sorted(rows[1:], key=lambda row: not row[2].startswith("`pip"))
    return "\n".join(_table(["kernels", "package", "install", "note"], rows))


def gpu_strategy_cell(strategy: str, kernel_name: str, masks: list[str]) -> str:
    """How many masks run fwd+bwd (and forward only) under ``strategy`` with a GPU kernel.

    On the kernel's home GPU problem at `CP_WORLD` ranks, this machine's circumstances left out.
    """
    kernel = get_kernel(kernel_name)
    problem = home_problem(kernel, gpu=True)
    machine = {f"kernel {kernel.name}: {r}" for r in kernel.environment_reasons(problem.device)}
    instance = STRATEGIES.get(strategy)({}, CP_WORLD)
    both = forward = 0
    for name in masks:
        mask = matrix_mask(name, problem.heads_kv)
        runs = [
            not [
                r
                for r in instance.not_supported_reasons(kernel, problem, mask, CP_WORLD, p)
                if r not in machine
            ]
            for p in SHOWN_PASSES
        ]
        both += all(runs)
        forward += runs[0] and not runs[1]
    cells = [f"✓ {both}"] if both else []
    cells += [f"fwd {forward}"] if forward else []
    return " · ".join(cells) or "–"


def gpu_strategy_matrix_markdown() -> str:
    """Markdown: strategies (rows) x the GPU-compared kernels (columns); masks each pass runs."""
    masks = list_masks()
    kernels = gpu_compared()
    rows = [
        [f"`{s}`", *(gpu_strategy_cell(s, k, masks) for k in kernels)] for s in STRATEGIES.names()
    ]
    return "\n".join(_table(["strategy", *(f"`{k}`" for k in kernels)], rows))


def command(args: argparse.Namespace) -> int:
    """``python -m lcab.report support``: print the three support matrices."""
    print(
        kernel_matrix_markdown(),
        strategy_matrix_markdown(),
        gpu_strategy_matrix_markdown(),
        sep="\n\n",
    )
    return 0
