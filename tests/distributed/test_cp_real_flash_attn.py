"""Ring P2P, USP and LoongTrain through flash-attn 2.8.3.post2's own Python, forward and backward.

Each rank imports the library's ``flash_attn`` package unchanged from the PyPI sdist over the
emulated ``flash_attn_2_cuda`` (`tests.helpers.emulated_flash_attn`): the forward goes through
``flash_attn_func`` / ``flash_attn_varlen_func`` and every ring step's backward through the
library's ``torch.library.custom_op`` ``flash_attn::_flash_attn(_varlen)_backward``. FA3 runs
beside it on stand-ins of both generations of its backward: the newest a custom op
(``flash_attn_3::_flash_attn_backward``, hopper 0251105a), the 2025-08 one a plain function
(203b9b3d). Out, dq, dk, dv must equal the single-process fp64 reference and the measured bytes
the analytic ones (`tests.distributed.grid`); refused cases are listed with their reason.
"""

from __future__ import annotations

import pytest

from tests.distributed.test_cp_library_backward import cases, run
from tests.helpers import emulated_flash_attn
from tests.helpers.standin_ranks import (
    rank_main_with_real_fa2,
    rank_main_with_real_fa2_fa3_aug_2025,
)

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(1200)]

MASKS = ["causal", "causal_document", "full_document", "sliding_window"]
#: Seconds a world may go without a result: a rank imports torch, lcab and flash-attn first, on
#: a machine shared with other test processes.
CASE_TIMEOUT = 180.0
FA3_GENERATIONS = {
    "fa3-custom-op": rank_main_with_real_fa2,
    "fa3-function-2025-08": rank_main_with_real_fa2_fa3_aug_2025,
}


@pytest.fixture(scope="module", autouse=True)
def _sdist_cached() -> None:
    """The ranks read the sdist from the cache: fetched here once (a CI run fails without)."""
    emulated_flash_attn.require_source_tree()


def grid(world: int, strategy: str, options: dict) -> list:
    return cases(world, strategy, options, MASKS, ("fa2", "fa3")) + cases(
        world, strategy, options, MASKS[:2], ("fa2",), head_dim=12
    )


def check(ok: list[str], refused: list[str]) -> None:
    for kernel in ("fa2", "fa3"):
        assert any(label.endswith(f" {kernel}") and " causal " in label for label in ok), refused
    assert any(" causal_document " in label and label.endswith(" fa2") for label in ok), refused
    print(f"{len(ok)} run, {len(refused)} refused:", *refused, sep="\n  ")


@pytest.mark.parametrize("generation", sorted(FA3_GENERATIONS))
@pytest.mark.parametrize("world", [2, 4])
def test_ring_through_the_real_flash_attn(world, generation, tmp_path) -> None:
    rank_fn = FA3_GENERATIONS[generation]
    check(*run(world, grid(world, "ring", {}), tmp_path, rank_fn, CASE_TIMEOUT))


@pytest.mark.parametrize("generation", sorted(FA3_GENERATIONS))
def test_usp_and_loongtrain_through_the_real_flash_attn(generation, tmp_path) -> None:
    both = grid(4, "usp", {"ulysses_degree": 2}) + grid(4, "loongtrain", {"ulysses_degree": 1})
    ok, refused = run(4, both, tmp_path, FA3_GENERATIONS[generation], CASE_TIMEOUT)
    assert any("loongtrain" in label and label.endswith(" fa2") for label in ok), refused
    assert any("usp" in label and label.endswith(" fa2") for label in ok), refused
    check(ok, refused)


def test_usp_and_loongtrain_at_world_2_through_the_real_flash_attn(tmp_path) -> None:
    """World 2: USP as a ring of two Ulysses groups of one, LoongTrain as a double ring of two
    one-rank windows (its outer hop carries K/V and the dK/dV accumulators)."""
    both = grid(2, "usp", {"ulysses_degree": 1}) + grid(
        2, "loongtrain", {"ulysses_degree": 1, "window_count": 2}
    )
    ok, refused = run(2, both, tmp_path, FA3_GENERATIONS["fa3-custom-op"], CASE_TIMEOUT)
    assert any("loongtrain" in label and label.endswith(" fa2") for label in ok), refused
    assert any("usp" in label and label.endswith(" fa2") for label in ok), refused
    check(ok, refused)
