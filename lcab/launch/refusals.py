"""Whether a job would end ``skipped``: the runner's own check, asked before anything runs.

Each job's first length is checked as the runner checks it (the kernel's
`not_supported_reasons`; under CP the strategy's, every rank's block included), so a dry run
never prices a job that would come back ``skipped``. What belongs to the machine the dry run
runs on (a package or GPU a login node lacks) is left out.
"""

from __future__ import annotations

from lcab.cell import Cell
from lcab.cp import STRATEGIES
from lcab.cp.hybrid import UlyssesRing
from lcab.kernels import Problem, get_kernel
from lcab.masks import make_mask


def job_refusal(cell: Cell) -> list[str]:
    """Why the job's passes would be skipped wherever it runs (empty: it runs).

    Only a refusal of every pass counts; the reasons are its first length's and mask sample's.
    """
    seqlen = cell.seqlens[0]
    kernel = get_kernel(cell.kernel, **cell.kernel_options)
    problem = Problem(  # named: the dry run asks its questions without loading torch
        seqlen, seqlen, cell.heads_q, cell.heads_kv, cell.head_dim, cell.dtype, cell.device
    )
    try:
        mask = make_mask(cell.mask, seqlen, seed=cell.mask_seed, **cell.mask_params)
    except ValueError as err:  # the runner records this length skipped with the same words
        return [f"mask {cell.mask} at seqlen {seqlen}: {err}"]
    machine = set(kernel.environment_reasons(cell.device))
    strategy = (
        None
        if cell.cp == "none"
        else STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)
    )
    found: list[str] = []
    for pass_ in cell.bench.passes:
        reasons = (
            kernel.not_supported_reasons(problem, mask, pass_)
            if strategy is None
            else strategy.not_supported_reasons(kernel, problem, mask, cell.world_size, pass_)
        )
        # a strategy names its kernel's reasons ("kernel fa3: needs package ..."): by the end
        reasons = [r for r in reasons if not any(r.endswith(m) for m in machine)]
        if not reasons:
            return []  # a pass runs: the job is not refused
        found += [r for r in reasons if r not in found]
    return found


FRONTIER_ON_SLURM = (
    "seqlen=frontier: a frontier search starts a fresh world per probe, which a multi-task "
    "SLURM job cannot; valid: the local launcher (launcher=local), or cp=none (a one-task job)"
)


def frontier_problems(cell: Cell) -> list[str]:
    """Why a SLURM job cannot search the cell's frontier (empty: it can, or is no search).

    Each probe needs a fresh world (`lcab.bench.frontier`); a SLURM job's tasks start once.
    """
    return [FRONTIER_ON_SLURM] if cell.frontier is not None and cell.world_size > 1 else []


def strategy_refusal(cell: Cell) -> list[str]:
    """Why the cell's strategy cannot run on its ranks at any length (empty: it can).

    The strategy's own rules (heads and ranks its degrees must divide).
    """
    if cell.cp == "none":
        return []
    strategy = STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)
    problem = Problem(1, 1, cell.heads_q, cell.heads_kv, cell.head_dim, "float32", "cpu")
    return strategy.reasons(problem, cell.world_size)


def layout_problems(cell: Cell, topology: str) -> list[str]:
    """Why the cell cannot be laid out on a SLURM ``topology`` (empty: it can).

    `strategy_refusal`, a Ulysses group inside a node (NVLink), and `frontier_problems`.
    """
    if cell.cp == "none":
        return []
    problems = frontier_problems(cell)
    for why in strategy_refusal(cell):
        problems.append(f"cp={cell.cp} on topology={topology}: {why}")
    strategy = STRATEGIES.get(cell.cp)(cell.cp_options, cell.devices_per_node)
    ulysses = strategy.ulysses_degree(cell.world_size)
    if isinstance(strategy, UlyssesRing) and cell.devices_per_node % ulysses:
        problems.append(
            f"cp.ulysses_degree={ulysses} does not divide the {cell.devices_per_node} ranks "
            "of a node: Ulysses groups must stay inside a node (all-to-all over NVLink)"
        )
    return problems
