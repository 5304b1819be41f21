"""Tokens per rank: what the dry run and the console tell a user about a CP cell's lengths.

Expected values are counted by hand (a sequence split evenly over the ranks, rounded up); the
pointer the warning gives (``seqlen=per_device_8k``) is checked to compose into a cell whose
ranks hold 8K tokens each, which the same function then leaves unwarned.
"""

from __future__ import annotations

import pytest

from lcab.bench.console import token_warnings
from lcab.cell import FULL_RATE_TOKENS, TILE_TOKENS, few_tokens_warning, tokens_per_rank
from lcab.config import resolve_cell
from lcab.config.preflight import composed_jobs
from lcab.launch.dry_run import plan_rows
from lcab.records.schema import RunRecord
from lcab.records.table import records_table

SLURM_96 = [
    "launcher=slurm_h100_example", "cp=ring", "kernel=fa3", "mask=causal_document",
    "topology=12x8", "problem.device=cuda",
]  # fmt: skip


@pytest.mark.parametrize(
    ("seqlen", "world", "want"),
    [(8192, 96, 86), (1024, 96, 11), (65536, 8, 8192), (786432, 96, 8192), (7, 8, 1), (5, 1, 5)],
)
def test_tokens_per_rank_is_the_even_split_rounded_up(seqlen: int, world: int, want: int) -> None:
    assert tokens_per_rank(seqlen, world) == want


def test_the_issue_s_96_gpu_sweep_is_warned_and_pointed_at_per_device_8k() -> None:
    warning = few_tokens_warning([1024, 2048, 4096, 8192], 96, "cuda")
    assert "4 of 4 lengths" in warning
    assert "as few as 11 tokens" in warning
    assert f"fewer than one {TILE_TOKENS}-row attention tile" in warning
    assert "seqlen=per_device_8k" in warning


def test_the_threshold_is_strict_and_gpu_only() -> None:
    at = FULL_RATE_TOKENS * 8
    assert few_tokens_warning([at], 8, "cuda") == ""
    below = few_tokens_warning([at - 8], 8, "cuda")
    assert "1 of 1 lengths" in below and "well below its plateau" in below
    assert few_tokens_warning([1024], 96, "cpu") == ""  # GPU kernels' thresholds
    assert few_tokens_warning([64], 1, "cuda") == ""  # one device: no split


def test_per_device_8k_gives_every_rank_8k_tokens_and_no_warning() -> None:
    ((_, cfg),) = composed_jobs([*SLURM_96, "seqlen=per_device_8k"], False)
    cell = resolve_cell(cfg)
    assert cell.seqlens == (8192 * 96,)
    assert [tokens_per_rank(s, cell.world_size) for s in cell.seqlens] == [8192]
    assert few_tokens_warning(cell.seqlens, cell.world_size, cell.device) == ""


def test_the_dry_run_shows_tokens_per_rank_and_the_warning() -> None:
    (row,) = plan_rows(SLURM_96, False)
    assert row.tokens_per_rank == ((1024, 11), (2048, 22), (4096, 43), (8192, 86))
    assert "seqlen=per_device_8k" in row.warning
    (fine,) = plan_rows([*SLURM_96, "seqlen=per_device_8k"], False)
    assert fine.tokens_per_rank == ((786432, 8192),) and fine.warning == ""


def _record(seqlen: int, world: int, cp: str = "ring") -> RunRecord:
    return RunRecord(
        kernel="fa3", cp=cp, mask="causal", seqlen=seqlen, world_size=world, device="cuda"
    )


def test_the_console_shows_tokens_per_rank_and_warns_per_cell() -> None:
    records = [_record(4096, 96), _record(8192, 96), _record(8192, 1, cp="none")]
    table, _ = records_table(records)
    cells = {c.header: list(c.cells) for c in table.columns}
    assert cells["seqlen"] == ["4,096", "8,192", "8,192"]
    assert cells["per\nrank"] == ["43", "86", ""]
    (line,) = token_warnings(records)
    assert line.startswith("warning: fa3 ring causal: 2 of 2 lengths")
    assert token_warnings([_record(8192 * 96, 96)]) == []
