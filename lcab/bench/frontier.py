"""The memory frontier of a cell: the longest sequence that runs without running out of memory.

At a million tokens memory comes before speed, and no anchor measures it (LongCA-bench writes
-1000 for an out-of-memory cell). Doubling then bisection, each probe a fresh world of workers
run once (``oom`` goes on, any other end stops the search); the frontier length then runs the
cell's protocol without the fp64 check. The rules: ``lcab/bench/README.md``, "The memory frontier".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from lcab.cell import TILE_TOKENS, Cell
from lcab.records.schema import RunRecord

FITS, NO_ROOM, STOP = "fits", "no room", "stop"
"""A probe's verdict: it ran; it ran out of memory; it ended otherwise (the search stops)."""


@dataclass
class Search:
    """The state of one search: what ran, what did not, and every probe in order."""

    fits: int | None = None
    fails: int | None = None
    probes: list[tuple[int, str]] = field(default_factory=list)
    stopped_at: int | None = None


def search(
    verdict: Callable[[int], str], start: int, limit: int, step: int, resolution: int
) -> Search:
    """Find the longest multiple of ``step`` in [step, limit] for which ``verdict`` is FITS.

    Memory grows with length: doubling finds a bracket, bisection narrows it.
    """
    state = Search()

    def probe(length: int) -> str:
        outcome = verdict(length)
        state.probes.append((length, outcome))
        if outcome == FITS:
            state.fits = length
        elif outcome == NO_ROOM:
            state.fails = length
        else:
            state.stopped_at = length
        return outcome

    top = _blocks(limit, step)
    length = min(_blocks(start, step), top)
    for _ in range(2 * top.bit_length() + 2):  # doubling (halving while the first probes fail)
        outcome = probe(length)
        if outcome == STOP:
            return state
        if outcome == FITS:
            if state.fails is not None or length >= top:
                break
            length = min(length * 2, top)
        else:
            if state.fits is not None or length <= step:
                break
            length = _blocks(length // 2, step)
    if state.fits is None or state.fails is None:
        return state
    for _ in range(top.bit_length() + 1):  # bisection halves the bracket each time
        if state.fails - state.fits <= max(step, state.fits // resolution):
            break
        middle = _blocks((state.fits + state.fails) // 2, step)
        if middle in (state.fits, state.fails):
            break
        if probe(middle) == STOP:
            break
    return state


def _blocks(length: int, step: int) -> int:
    """``length`` rounded down to whole steps (at least one)."""
    return max(step, length // step * step)


def search_cells(cell: Cell) -> tuple[Cell, Cell]:
    """(Each probe's cell: one repetition, bare; the frontier length's), neither with fp64 check."""
    timed = dataclasses.replace(cell.bench, check_numerics=False)
    once = dataclasses.replace(
        timed, warmup=0, reps=1, warmup_ms=None, rep_ms=None, telemetry="off", profile=False
    )
    return dataclasses.replace(cell, bench=once), dataclasses.replace(cell, bench=timed)


def run_frontier(
    cell: Cell, write: Callable[[RunRecord], None], run: Callable[[Cell], list[RunRecord]]
) -> RunRecord:
    """Search ``cell``'s frontier with ``run`` (one probe's records) and write its one record."""
    assert cell.frontier is not None
    probes: dict[int, RunRecord] = {}

    probe, timed = search_cells(cell)

    def verdict(length: int) -> str:
        records = run(probe.at_length(length))
        record = records[-1] if records else None
        if record is None:
            return STOP
        probes[length] = record
        if record.status == "ok" or record.status == "numerics_mismatch":
            return FITS
        return NO_ROOM if record.status == "oom" else STOP

    step = TILE_TOKENS * cell.world_size
    state = search(
        verdict, cell.seqlens[0], cell.frontier.max_tokens, step, cell.frontier.resolution
    )
    # the probes' own rows, before the record of one of them gets the search's reasons
    rows = [_probe_row(probes.get(length), length) for length, _ in state.probes]
    record = probes[state.fits if state.fits is not None else state.probes[-1][0]]
    if state.fits is not None:
        measured = run(timed.at_length(state.fits))
        last = measured[-1] if measured else None
        if last is not None and last.status == "ok":
            record = last
        else:
            ended = f"{last.status}: {'; '.join(last.reasons[:1])}" if last else "lost"
            record.reasons.append(
                f"the timed run at the frontier ended {ended}; these figures are its probe's"
            )
    record.frontier_probes = rows
    _add_search(record, cell, state, probes)
    write(record)
    return record


def _add_search(record: RunRecord, cell: Cell, state: Search, probes: dict[int, RunRecord]) -> None:
    """The search's fields on the frontier's ``record``."""
    if state.stopped_at is not None:
        stop = probes.get(state.stopped_at)
        why = stop.reasons[0] if stop is not None and stop.reasons else "no record"
        record.reasons.append(
            f"frontier search stopped at seqlen {state.stopped_at:,} "
            f"({stop.status if stop else 'lost'}: {why})"
        )
    record.frontier_tokens = state.fits
    record.frontier_tokens_per_device = (
        None if state.fits is None else state.fits // cell.world_size
    )
    record.frontier_bracket = [state.fits, state.fails]
    record.frontier_budget_gib = cell.bench.memory_budget_gib
    if state.fits is not None:
        record.frontier_peak_mib, delta = _largest_memory(record)
        if delta is not None:
            per_device = state.fits // cell.world_size
            record.frontier_bytes_per_token = delta * 2**20 / per_device


def _largest_memory(record: RunRecord) -> tuple[float | None, float | None]:
    """(peak, rise) in MiB: the largest over the record's passes (None: not measured)."""
    passes = [record.pass_result(p) for p in record.passes]
    peaks = [r.mem_peak_mib for r in passes if r.mem_peak_mib is not None]
    deltas = [r.mem_delta_mib for r in passes if r.mem_delta_mib is not None]
    return (max(peaks) if peaks else None), (max(deltas) if deltas else None)


def _probe_row(record: RunRecord | None, length: int) -> dict[str, object]:
    """One probe as the record lists it."""
    if record is None:
        return {"seqlen": length, "status": "lost"}
    peak, delta = _largest_memory(record)
    return {
        "seqlen": length,
        "status": record.status,
        "mem_peak_mib": peak,
        "mem_delta_mib": delta,
        "reason": (record.reasons[0][:200] if record.reasons else None),
    }
