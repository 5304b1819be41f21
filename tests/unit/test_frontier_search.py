"""The frontier search against a known limit: whatever the limit, the bracket holds it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.bench.frontier import FITS, NO_ROOM, STOP, run_frontier, search
from lcab.cell import BenchConfig, Cell
from lcab.config import resolve_cell
from lcab.config.preflight import composed_jobs
from lcab.records.schema import RunRecord
from lcab.records.table import frontier_line

STEP = 128


def _memory_limit(limit: int) -> tuple[list[int], object]:
    asked: list[int] = []

    def verdict(length: int) -> str:
        asked.append(length)
        return FITS if length <= limit else NO_ROOM

    return asked, verdict


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(min_value=STEP, max_value=1 << 22),
    start=st.sampled_from([128, 1024, 4096, 65536]),
    resolution=st.sampled_from([2, 8, 16, 64]),
)
def test_the_bracket_holds_the_limit_to_the_resolution(
    limit: int, start: int, resolution: int
) -> None:
    asked, verdict = _memory_limit(limit)
    state = search(verdict, start, 1 << 23, STEP, resolution)
    assert state.fits is not None and state.fails is not None
    assert state.fits <= limit < state.fails
    assert state.fails - state.fits <= max(STEP, state.fits // resolution)
    assert all(length % STEP == 0 for length in asked)
    assert len(asked) == len(set(asked))  # no length probed twice
    assert len(asked) <= 2 * 23 + 2  # doubling then bisection: logarithmic


def test_a_first_probe_that_fails_halves_down_to_what_fits() -> None:
    asked, verdict = _memory_limit(700)
    state = search(verdict, 4096, 1 << 20, STEP, 16)
    assert asked[:4] == [4096, 2048, 1024, 512]
    assert state.fits == 640 and state.fails == 768  # one block apart


def test_nothing_fits_leaves_no_frontier() -> None:
    _, verdict = _memory_limit(100)  # under one block
    state = search(verdict, 1024, 1 << 20, STEP, 16)
    assert state.fits is None and state.fails == STEP


def test_the_search_stops_at_its_maximum() -> None:
    asked, verdict = _memory_limit(1 << 30)
    state = search(verdict, 1000, 100_000, STEP, 16)
    assert state.fits == 99_968 and state.fails is None  # 100,000 rounded down to blocks
    assert asked == [896, 1792, 3584, 7168, 14336, 28672, 57344, 99968]


def test_a_probe_that_ends_otherwise_stops_the_search() -> None:
    def verdict(length: int) -> str:
        return STOP if length >= 4096 else FITS

    state = search(verdict, 1024, 1 << 20, STEP, 16)
    assert state.fits == 2048 and state.stopped_at == 4096 and state.fails is None


def _searched(probes: list[tuple[int, str]], bracket: list[int | None]) -> RunRecord:
    """The record of a search that made ``probes`` (with the search's own bracket)."""
    return RunRecord(
        kernel="ranges",
        cp="ring",
        mask="causal",
        world_size=4,
        frontier_bracket=bracket,
        frontier_probes=[{"seqlen": n, "status": s} for n, s in probes],
    )


def test_the_console_line_says_where_a_search_stopped_and_never_calls_it_the_maximum() -> None:
    stopped = _searched([(4096, "ok"), (8192, "ok"), (16384, "error")], [8192, None])
    assert frontier_line(stopped) == (
        "frontier ranges/ring/causal: 8,192 tokens (2,048/device) fit; search stopped at "
        "16,384 (error)"
    )
    both = _searched([(4096, "ok"), (16384, "oom"), (8192, "timeout")], [4096, 16384])
    assert frontier_line(both) == (
        "frontier ranges/ring/causal: 4,096 tokens (1,024/device) fit, 16,384 did not; "
        "search stopped at 8,192 (timeout)"
    )
    top = _searched([(4096, "ok"), (8192, "ok")], [8192, None])
    assert frontier_line(top) == (
        "frontier ranges/ring/causal: 8,192 tokens (2,048/device) fit (the search's maximum)"
    )
    first = _searched([(4096, "error")], [None, None])
    assert frontier_line(first) == (
        "frontier ranges/ring/causal: no length ran; search stopped at 4,096 (error)"
    )


# ------------------------------------------------- what each run of a measured search times
LIMIT = 5000
"""Tokens the fake cell fits."""


def _searched_cell() -> Cell:
    overrides = ["kernel=ranges", "mask=causal", "seqlen=frontier", "bench.warmup=3"]
    ((_, cfg),) = list(composed_jobs([*overrides, "bench.reps=7"], False))
    return resolve_cell(cfg)


def _runs(timed_status: str = "ok") -> tuple[list[tuple[int, BenchConfig]], object]:
    """A world that fits up to `LIMIT` tokens; the frontier's second run ends ``timed_status``."""
    ran: list[tuple[int, BenchConfig]] = []

    def run(cell: Cell) -> list[RunRecord]:
        (length,) = cell.seqlens
        again = any(n == length for n, _ in ran)
        ran.append((length, cell.bench))
        status = ("ok" if length <= LIMIT else "oom") if not again else timed_status
        record = RunRecord(kernel="ranges", cp="none", mask="causal", seqlen=length)
        record.status, record.reasons = status, [f"run {len(ran)}"]
        return [record]

    return ran, run


def test_probes_run_once_and_only_the_frontier_gets_the_full_protocol() -> None:
    ran, run = _runs()
    written: list[RunRecord] = []
    record = run_frontier(_searched_cell(), written.append, run)  # type: ignore[arg-type]
    *probes, (last, timed) = ran
    assert len(probes) > 3 and last == record.frontier_tokens
    assert last == max(n for n, _ in probes if n <= LIMIT)  # the longest probe that ran
    for _, bench in probes:  # does it fit and run once
        assert (bench.warmup, bench.reps, bench.warmup_ms, bench.rep_ms) == (0, 1, None, None)
        assert bench.telemetry == "off" and not bench.check_numerics and not bench.profile
    assert (timed.warmup, timed.reps, timed.check_numerics) == (3, 7, False)
    assert written == [record] and record.reasons == [f"run {len(ran)}"]  # the timed run's
    assert [p["seqlen"] for p in record.frontier_probes or []] == [n for n, _ in probes]


def test_a_timed_run_that_fails_at_the_frontier_leaves_the_probe_s_record_saying_so() -> None:
    ran, run = _runs(timed_status="oom")
    record = run_frontier(_searched_cell(), lambda r: None, run)  # type: ignore[arg-type]
    frontier = ran[-1][0]
    probe = next(i for i, (n, _) in enumerate(ran) if n == frontier) + 1
    assert record.status == "ok" and record.reasons[0] == f"run {probe}"
    assert "the timed run at the frontier ended oom" in record.reasons[1]
    assert record.frontier_tokens == frontier
