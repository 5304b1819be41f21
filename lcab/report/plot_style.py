"""The report's colours and dashes, decided once for every figure (`lcab.plot.data` the rest).

One kernel (or CP strategy) has one colour in every plot and both renderers (`palette`, from
the registries); the lines of one series differ by dash, from its sorted (world size, variant)
pairs, so nothing depends on the order plots are drawn in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lcab.plot.data import DASHES, Line
from lcab.report.frame import SERIES, VARIANT

PASS_TITLES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}
"""How a pass is named in panel titles and hovers."""
SEQLEN_AXIS = "sequence length (tokens, log2 scale)"
SERIES_COLOURS = (
    *("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"),
    *("#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"),
    *("#e7ba52", "#ad494a", "#a55194", "#6b6ecf", "#9c9ede", "#cedb9c", "#e7969c", "#de9ed6"),
    *("#31a354", "#756bb1", "#636363", "#fd8d3c", "#3b5b92", "#b5cf6b", "#d6616b", "#8ca252"),
)
"""Qualitative colours: the kernels declare theirs (`Kernel.colour`); CP strategies and series
the registries do not know take the rest (see `palette`)."""


def _preferred_colour(series: str) -> str | None:
    """A series' own colour: its kernel's (`Kernel.colour`) or its CP strategy's.

    Colours come from the registries, not from what a report holds, so ``ranges`` keeps its
    colour from one report (or README figure) to the next. A strategy takes, in registration
    order, the colours of `SERIES_COLOURS` that no kernel declares.
    """
    from lcab.cp import STRATEGIES
    from lcab.kernels import KERNELS

    key = series.split("/", 1)[0]  # "<cp>/<kernel>": coloured by the strategy
    if key in KERNELS:
        return KERNELS.get(key).colour
    declared = {KERNELS.get(name).colour for name in KERNELS.names()}
    free = [c for c in SERIES_COLOURS if c not in declared] or list(SERIES_COLOURS)
    strategies = STRATEGIES.names()
    return free[strategies.index(key) % len(free)] if key in strategies else None


def palette(names: Iterable[str]) -> dict[str, str]:
    """One distinct colour per series name, the same whatever else the report holds.

    Each series gets its preferred colour (`_preferred_colour`) unless a series before it in
    sorted order took that colour; those, and names the registries do not know, take the first
    colours still free (cycling once all are used).
    """
    colours: dict[str, str] = {}
    for name in sorted(set(names)):
        colour = _preferred_colour(name)
        if colour is not None and colour not in colours.values():
            colours[name] = colour
    for name in sorted(set(names) - colours.keys()):
        free = [c for c in SERIES_COLOURS if c not in colours.values()]
        colours[name] = free[0] if free else SERIES_COLOURS[len(colours) % len(SERIES_COLOURS)]
    return colours


def hardware_label(frame: pd.DataFrame) -> str:
    """What the figures ran on, for titles: ``float32 on AMD EPYC (cpu)``.

    A figure read without its page (a PNG in a paper or README) must say that 0.1 TFLOP/s is a
    CPU figure; mixed inputs are counted rather than listed, unknown parts left out.
    """
    dtypes = sorted({str(d) for d in frame["dtype"].dropna() if d})
    devices = sorted(
        {
            f"{name} ({kind})" if name else str(kind)
            for name, kind in zip(frame["device_name"], frame["device"], strict=True)
            if name or kind
        }
    )
    parts = [dtypes[0] if len(dtypes) == 1 else f"{len(dtypes)} dtypes" if dtypes else ""]
    if devices:
        parts.append(devices[0] if len(devices) == 1 else f"{len(devices)} device types")
    return " on ".join(p for p in parts if p)


@dataclass(frozen=True)
class LineStyle:
    """Legend label, palette key, colour and dash of one line."""

    label: str
    series: str
    colour: str
    dash: str

    def draw(self, x: Iterable[float], y: Iterable[float], **fields: Any) -> Line:
        """A `Line` in this style through ``x``, ``y``; ``fields`` set the rest (or the label)."""
        return Line(**{**dataclasses.asdict(self), **fields}, x=tuple(x), y=tuple(y))


class Styler:
    """The report's colours (one per series) and dashes (per series, world size, variant)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.colours = palette(frame[SERIES])
        self.dashes: dict[tuple[str, int, str], str] = {}
        keys = frame[[SERIES, "world_size", VARIANT]].drop_duplicates()
        for series, group in keys.groupby(SERIES, sort=True):
            pairs = sorted(zip(group["world_size"], group[VARIANT], strict=True))
            for i, (world, variant) in enumerate(pairs):
                self.dashes[(str(series), int(world), str(variant))] = DASHES[i % len(DASHES)]

    def line(self, series: str, world: int | None, variant: str, cp: bool) -> LineStyle:
        """The style of a line; ``world`` None: the line runs across world sizes."""
        label = f"{series} ×{world}" if cp and world is not None else series
        return LineStyle(
            label=f"{label} [{variant}]" if variant else label,
            series=series,
            colour=self.colours[series],
            dash="solid" if world is None else self.dashes.get((series, world, variant), "solid"),
        )
