"""The comparison with the published H100 table: its cells, its pair ordering rule, its pool."""

from __future__ import annotations

import json

import pytest

from lcab.plan.hardware import load_profile
from lcab.plan.published import (
    CHECKED,
    CP_SIZES,
    Comparison,
    compare,
    ordering_agreement,
    published_cells,
)
from lcab.records.published import PUBLISHED_FILE


def test_the_checked_cells_are_the_data_files_h100_cp_charts():
    """80 cells (4 charts x 5 strategies x 4 sizes), each value as the JSON holds it."""
    groups = [g for g in json.loads(PUBLISHED_FILE.read_text())["groups"]]
    raw = {}
    for g in groups:
        if g["id"] == "magi-cp-h100" and (g["mask"], g["pass"]) in CHECKED:
            for row in g["rows"]:
                cells = dict(zip(g["columns"], row, strict=True))
                raw[(g["mask"], g["pass"], cells["cp"], cells["world"])] = cells["value"]
    table = published_cells()
    got = {
        (mask, pass_, cp, world): p.value
        for (mask, pass_), strategies in table.items()
        for cp, by_world in strategies.items()
        for world, p in by_world.items()
    }
    assert got == raw and len(got) == 80
    for strategies in table.values():
        assert list(strategies) == ["ulysses", "ring", "ring_allgather", "usp", "loongtrain"]
        for by_world in strategies.values():
            assert sorted(by_world) == list(CP_SIZES)
            assert all(
                p.tokens // p.world == 8192 and p.kernels == ("fa3",) for p in by_world.values()
            )


def test_ordering_counts_only_pairs_published_further_apart_than_their_reading_errors():
    # full fwd at cp = 8, published (±3 each): ulysses 606, ring 511, ring_allgather 606,
    # usp 580, loongtrain 578. Pairs more than 6 apart (by hand): ring with each of the other
    # four, and ulysses / ring_allgather with usp / loongtrain: 8 (ulysses-AG, usp-LT are not).
    predicted = {"ulysses": 600, "ring": 700, "ring_allgather": 610, "usp": 590, "loongtrain": 570}
    published = {"ulysses": 606, "ring": 511, "ring_allgather": 606, "usp": 580, "loongtrain": 578}
    rows = [Comparison("full", "fwd", cp, 8, published[cp], v, 3.0) for cp, v in predicted.items()]
    agreement = ordering_agreement(rows)
    # ring predicted fastest: its 4 pairs are wrong; ulysses and AG above usp and LT: 4 right
    assert agreement[("full", "fwd")] == (4, 8)
    assert agreement[("causal", "fwd")] == (0, 0)  # no rows, no pairs
    # read less closely (±10 each), usp-ring_allgather (26 apart) still counts, 580-578 never
    wide = [Comparison("full", "fwd", r.cp, 8, r.published, r.predicted, 10.0) for r in rows]
    assert ordering_agreement(wide)[("full", "fwd")] == (4, 8)


def test_the_worker_pool_returns_the_serial_rows_in_order():
    hardware = load_profile("h100_nvlink_ib")
    serial = compare(hardware, worlds=(8,), samples=1, workers=1)
    assert compare(hardware, worlds=(8,), samples=1, workers=2) == serial
    # one row per (mask, pass, strategy), each against its published value at cp = 8
    table = published_cells()
    assert [(r.mask, r.pass_, r.cp) for r in serial] == [
        (mask, pass_, cp) for (mask, pass_), strategies in table.items() for cp in strategies
    ]
    for r in serial:
        figure = table[(r.mask, r.pass_)][r.cp][8]
        assert r.world == 8 and r.published == figure.value
        assert r.reading_error == figure.error
        assert r.error == pytest.approx(r.predicted / r.published - 1)
