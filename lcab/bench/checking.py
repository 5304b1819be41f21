"""The numerics check of one (cell, length), as the runner runs it: rows, budget, verdicts.

The rows (all, or a seeded sample every rank knows), whether the checking rank can afford it
(decided there and shared: the check is collective), and each pass's check, whose failure is a
recorded reason, never the loss of the pass's timings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lcab.bench.inputs import SeededInputs
from lcab.bench.numerics import Reference, compare, memory_budget, reference_bytes, run_check
from lcab.bench.results import is_oom, short_error
from lcab.bench.targets import Target
from lcab.kernels import PreparedAttention, Problem
from lcab.kernels.reference import sample_rows
from lcab.lazy import lazy_module
from lcab.masks import AttnMask
from lcab.records.schema import RunRecord

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


class NumericsCheck:
    """The check of one length on one rank; results and reasons go into ``record``."""

    def __init__(
        self, target: Target, problem: Problem, record: RunRecord, full: bool, rows: int, seed: int
    ) -> None:
        self.target, self.problem, self.record = target, problem, record
        self.full = full
        self.rows: torch.Tensor | None = None if full else sample_rows(problem.seqlen_q, rows, seed)
        """Query rows checked (None: all)."""
        self.skipped: str | None = None
        """Why the check did not run (None: it ran, or was not asked for)."""

    def allowed(self) -> bool:
        """Whether the checking rank can afford the check: rank 0's verdict, on every rank."""
        p = self.problem
        rows = None if self.rows is None else len(self.rows)
        need = reference_bytes(p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, rows)
        budget = memory_budget(p.torch_device) if self.target.rank == 0 else 0
        allowed = self.target.share([float(need <= budget)])[0] > 0
        if not allowed:
            self.skipped = (
                f"numerics check skipped: it needs about {need / 2**20:,.0f} MiB on the checking "
                f"rank, over its budget of {budget / 2**20:,.0f} MiB (timings kept)"
            )
        return allowed

    def reference(self, mask: AttnMask, source: SeededInputs) -> Reference | None:
        """The fp64 reference, on the checking rank only."""
        return Reference(mask, source, self.rows) if self.target.rank == 0 else None

    def run(
        self,
        pass_: str,
        prepared: PreparedAttention,
        native: dict[str, torch.Tensor],
        reference: Reference | None,
    ) -> None:
        """Check one pass against the reference; a failing check never costs the timings.

        Under CP a failure in the collective call ends the cell (peers wait in it); the
        reference is computed on rank 0 after every collective, so its failure is a reason.
        """
        try:
            results = run_check(pass_, prepared, native, self.rows, self.target.collector(prepared))
        except Exception as err:
            if self.target.world > 1:
                raise
            self._failed(pass_, err)
            return
        if results is None or reference is None:
            return
        try:
            errors = compare(results, reference)
        except Exception as err:
            self._failed(pass_, err)
            return
        result = self.record.pass_result(pass_)
        result.errors = errors
        result.max_abs_err = max(errors.values()) if errors else None

    def _failed(self, pass_: str, err: Exception) -> None:
        kind = "out of memory" if is_oom(err) else type(err).__name__
        self.record.reasons.append(
            f"{pass_}: numerics check failed ({kind}: {short_error(err, 200)}); timings kept"
        )

    def finalise(self, tolerance: float) -> None:
        """The record's numerics mode and tolerance (and why the check was skipped)."""
        self.record.numerics_mode = "full" if self.full else "sampled"
        self.record.numerics_tolerance = tolerance
        if self.skipped is not None:
            self.record.numerics_mode = "skipped"
            self.record.reasons.append(self.skipped)
