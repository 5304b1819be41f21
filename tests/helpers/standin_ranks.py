"""A CP rank that runs with the GPU libraries' stand-ins installed (for ``run_grid``).

Ranks start from a forkserver, so a stand-in put into ``sys.modules`` by the test process is
not in theirs: this rank function installs FA2, FA3 (newest generation) and FFA stand-ins
(built from the upstream tables) before it runs the grid's cases.
"""

from __future__ import annotations

import sys
from typing import Any


def rank_main_with_standins(
    rank: int, world: int, rendezvous: str, messages: Any, cases: list[Any]
) -> None:
    """`tests.distributed.grid.rank_main` with the library stand-ins importable."""
    from tests.distributed.grid import rank_main
    from tests.helpers import standin_flash_attn, standin_magi_ffa

    for build in (
        standin_flash_attn.fa2_modules,
        standin_flash_attn.fa3_modules,
        standin_magi_ffa.modules,
    ):
        sys.modules.update(build())
    rank_main(rank, world, rendezvous, messages, cases)
