"""``python -m lcab.perf predict`` checks cells the CPU profile was never fitted on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcab.perf.__main__ import _topics
from lcab.perf.predict import CELLS, MORE_CELLS, PROTOCOL

FIT_RECORDS = Path(__file__).resolve().parents[2] / "notebooks" / "data" / "plan_cpu_records.jsonl"


def _axis(key: str, cells: list[str] = CELLS) -> list[str]:
    (value,) = [o.split("=", 1)[1] for o in cells + PROTOCOL if o.split("=", 1)[0] == key]
    return value.strip("[]").split(",")


@pytest.mark.parametrize(("topic", "cells"), [("predict", CELLS), ("predict-more", MORE_CELLS)])
def test_the_topic_is_registered_and_its_cells_are_outside_the_fit(
    topic: str, cells: list[str]
) -> None:
    assert _topics()[topic].__module__ == "lcab.perf.predict"
    fit = [json.loads(line) for line in FIT_RECORDS.read_text().splitlines() if line.strip()]
    fit_masks = {r["mask"] for r in fit}
    fit_per_rank = {r["seqlen"] // r["world_size"] for r in fit}
    assert fit_masks == {"causal", "causal_document", "share_question"}
    assert not set(_axis("mask", cells)) & fit_masks  # no mask the profile was fitted on
    assert not {int(s) for s in _axis("seqlen.values", cells)} & fit_per_rank  # nor its length
    assert _axis("hardware", cells) == ["auto"] and _axis("kernel", cells) == ["ranges"]
