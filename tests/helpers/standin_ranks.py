"""CP ranks that run with the GPU libraries' stand-ins installed (for ``run_grid``).

Ranks start from a forkserver, so a stand-in put into ``sys.modules`` by the test process is
not in theirs: these rank functions install them before they run the grid's cases.
`rank_main_with_standins`: FA2, FA3 (newest generation, a custom op) and FFA stand-ins built
from the upstream tables. `rank_main_with_real_fa2` and `rank_main_with_real_fa2_fa3_aug_2025`:
flash-attn 2.8.3.post2's own Python over the emulated ``flash_attn_2_cuda``
(`tests.helpers.emulated_flash_attn`, whose sdist the test process has cached), with FA3's
newest (custom op) or 2025-08 (plain function) backward and FFA as stand-ins.
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


def _with_real_fa2(fa3_backward: str, *args: Any) -> None:
    from tests.distributed.grid import rank_main
    from tests.helpers import emulated_flash_attn, standin_flash_attn, standin_magi_ffa

    # the test process has written and checked the files (`source_tree`) before the ranks start
    emulated_flash_attn.install(emulated_flash_attn.ROOT)
    backward = getattr(standin_flash_attn, fa3_backward)
    sys.modules.update(standin_flash_attn.fa3_modules(_flash_attn_backward=backward))
    sys.modules.update(standin_magi_ffa.modules())
    rank_main(*args)


def rank_main_with_real_fa2(
    rank: int, world: int, rendezvous: str, messages: Any, cases: list[Any]
) -> None:
    """FA2's real Python (emulated extension); FA3's newest backward, a custom op."""
    _with_real_fa2("fa3_flash_attn_backward", rank, world, rendezvous, messages, cases)


def rank_main_with_real_fa2_fa3_aug_2025(
    rank: int, world: int, rendezvous: str, messages: Any, cases: list[Any]
) -> None:
    """FA2's real Python (emulated extension); FA3's 2025-08 backward, a plain function."""
    _with_real_fa2("fa3_flash_attn_backward_aug_2025", rank, world, rendezvous, messages, cases)
