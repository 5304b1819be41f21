"""Published attention figures, stored once: `load_published` reads ``published.json``.

Every anchor publishes pictures; this holds their numbers once, with source and reading, for
the report (`lcab.report.anchors`) and the planner (`lcab.plan.published`, `kernel_figures`).
JSON (standard library on Python 3.10), in groups: a group states what its numbers share once,
``columns`` what changes per row (``mask.<name>``: a mask parameter; ``error``: a row's own
reading error). ``kernels`` maps each source library to the lcab kernels that run it (cuDNN:
``cudnn`` and ``sdpa_cudnn``, the same engine).

**What it holds, in this order** (964 numbers, TFLOP/s; per GPU, slowest rank, under CP):

* ``longca-v1`` — the LongCA-bench paper (arXiv 2510.17896v1): Tables 3-5, its only printed
  numbers (block-sparse kernels on one H100); its charts survive nowhere as numbers.
* ``fa3-paper`` — FlashAttention-3 (arXiv 2407.08608) Figs. 5-6, head dim 128, H100 SXM5: the
  values printed above the bars (16K tokens a batch, 16 heads).
* ``cudnn-fe-gb200`` — NVIDIA cudnn-frontend's Llama-3.1 CSV on GB200 (cuDNN 9.27 and FA4, bf16,
  batch 2), a table read as printed.
* ``magi-cp-h100``, ``magi-cp-b200`` — the MagiAttention CP benchmark (LongCA-bench's companion
  blog): Ulysses, Ring P2P, Ring AllGather, USP and LoongTrain at 8-64 GPUs, every mask and pass;
  its hybrid and MagiAttention series are left out (no lcab strategy runs them).
* ``magi-kernel-h100`` — the same blog's one-H100 kernel charts (FA2, FA3, cuDNN, Flex,
  FlashMask, SDPA, FFA on full, causal, document and sliding-window masks, 1K-32K). Its
  ``varlen block causal`` charts are left out: the blog gives no block size, so lcab's
  ``block_causal_document`` cannot be said to be the same mask.

The MagiAttention charts were read from the PNGs' pixels at commit 2c641357 (bar-top markers
against the gridlines, ±3 TFLOP/s, ±5 where a line hid the marker), within 5 of two by-eye
readings (``paper_digest.md`` §8.1, §8.3); bars under 5 TFLOP/s and those marked ✗ are left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from lcab.flops import PASSES

PUBLISHED_FILE = Path(__file__).with_name("published.json")
READS = {
    "table": "table (printed number)",
    "label": "chart label (number printed on the bar)",
    "chart": "chart, read off the image ±{error:g} {unit}",
}
"""How a number was read; a ``chart`` reading must state its error."""
UNITS = ("TFLOP/s", "ms")


class BadPublishedError(ValueError):
    """A group or row of the data file is malformed; the message names the group, row, field."""


@dataclass(frozen=True)
class Published:
    """One published number: what it measures, where it comes from, how it was read."""

    source_id: str
    source: str
    figure: str
    url: str
    read: str
    library: str
    kernels: tuple[str, ...]
    """The lcab kernels that run ``library`` (empty: none does)."""
    gpu: str
    """GPU model as the source names it (``H100``, ``GB200``)."""
    dtypes: tuple[str, ...]
    heads_q: int
    heads_kv: int
    head_dim: int
    batch: int
    seqlen: int
    """Tokens of one sequence (the mask spans it); ``batch`` sequences a call."""
    world: int
    cp: str
    """lcab's name of the CP strategy (``none`` on one GPU)."""
    mask: str
    """lcab's mask name; ``published_mask`` is the source's own."""
    pass_: str
    value: float
    unit: str = "TFLOP/s"
    error: float | None = None
    """Reading error, in ``unit`` (charts)."""
    mask_params: dict[str, Any] = field(default_factory=dict)
    published_mask: str = ""
    gpus_per_node: int | None = None
    docs: str = ""
    """How the source sampled documents, for document masks."""
    note: str = ""
    repo: str = ""
    commit: str = ""
    path: str = ""

    @property
    def tokens(self) -> int:
        """Tokens of one call, all sequences."""
        return self.batch * self.seqlen

    @property
    def how_read(self) -> str:
        """``table (printed number)``, or a chart reading with its error."""
        return READS[self.read].format(error=self.error or 0, unit=self.unit)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _one_of(options: Any) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in options), f"one of {', '.join(options)}"


_INTEGER = (lambda v: _positive(v) and isinstance(v, int), "a positive integer")
_TEXT = (_text, "text")
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **dict.fromkeys(("heads_q", "heads_kv", "head_dim", "batch", "seqlen", "world"), _INTEGER),
    "gpus_per_node": _INTEGER,
    **dict.fromkeys(("id", "figure", "library", "gpu", "cp", "mask", "published_mask"), _TEXT),
    **dict.fromkeys(("docs", "note", "repo", "path"), _TEXT),
    "source": (_text, "the citation: paper or repository, figure or table"),
    "url": (lambda v: isinstance(v, str) and v.startswith("https://"), "an https:// address"),
    "read": _one_of(READS),
    "unit": _one_of(UNITS),
    "pass": _one_of(PASSES),
    "error": (_positive, "a reading error > 0"),
    "value": (_positive, "a number > 0"),
    "dtype": (
        lambda v: _text(v) or (isinstance(v, list) and bool(v) and all(map(_text, v))),
        "a dtype name or a list of them",
    ),
    "mask_params": (lambda v: isinstance(v, dict), "an object of mask parameters"),
    "commit": (lambda v: isinstance(v, str) and len(v) == 40, "a 40-digit commit"),
}
"""Every field a group or row may set: its check and what it must be."""
REQUIRED = (
    *("id", "source", "figure", "url", "read", "library", "gpu", "dtype", "heads_q"),
    *("heads_kv", "head_dim", "batch", "seqlen", "world", "cp", "mask", "pass", "value"),
)


def _published(where: str, data: dict[str, Any], kernels: dict[str, list[str]]) -> Published:
    """One row's fields (group defaults and row values merged) as a `Published`."""
    missing = [name for name in REQUIRED if name not in data]
    if data.get("read") == "chart" and "error" not in data:
        missing.append("error")  # a chart reading states its error
    if missing:
        raise BadPublishedError(f"{where}: field {missing[0]!r} is missing")
    for name, value in data.items():
        check, must = FIELDS[name]
        if not check(value):
            raise BadPublishedError(f"{where}: {name}={value!r}: must be {must}")
    if data["library"] not in kernels:
        raise BadPublishedError(f"{where}: library={data['library']!r} is not in 'kernels'")
    if data["batch"] * data["seqlen"] % data["world"]:
        raise BadPublishedError(f"{where}: batch x seqlen does not split over {data['world']}")
    dtype = data.pop("dtype")
    return Published(
        source_id=data.pop("id"),
        pass_=data.pop("pass"),
        value=float(data.pop("value")),
        dtypes=(dtype,) if isinstance(dtype, str) else tuple(dtype),
        kernels=tuple(kernels[data["library"]]),
        **data,
    )


def parse_published(document: Any, name: str = PUBLISHED_FILE.name) -> list[Published]:
    """The rows of a parsed data file, in file order.

    Raises BadPublishedError: the first malformed group or row, named with its field.
    """
    if not isinstance(document, dict) or not isinstance(document.get("groups"), list):
        raise BadPublishedError(f"{name}: expected an object with a 'groups' list")
    kernels = document.get("kernels", {})
    if not isinstance(kernels, dict) or not all(isinstance(v, list) for v in kernels.values()):
        raise BadPublishedError(f"{name}: 'kernels' must map library names to lists of kernels")
    out = []
    for number, group in enumerate(document["groups"], 1):
        where = f"{name}: group {number} ({group.get('id', '?')})"
        shared = {k: v for k, v in group.items() if k not in ("columns", "rows")}
        columns, rows = group.get("columns", []), group.get("rows", [])
        unknown = [k for k in [*shared, *columns] if k not in FIELDS and not k.startswith("mask.")]
        if unknown or not rows:
            why = f"unknown field {unknown[0]!r}" if unknown else "no rows"
            raise BadPublishedError(f"{where}: {why}")
        for index, row in enumerate(rows, 1):
            if not isinstance(row, list) or len(row) != len(columns):
                raise BadPublishedError(f"{where} row {index}: expected {len(columns)} values")
            data = dict(shared, mask_params=dict(shared.get("mask_params", {})))
            for column, value in zip(columns, row, strict=True):
                if column.startswith("mask."):
                    data["mask_params"][column.removeprefix("mask.")] = value
                else:
                    data[column] = value
            out.append(_published(f"{where} row {index}", data, kernels))
    return out


@cache
def load_published(path: Path = PUBLISHED_FILE) -> tuple[Published, ...]:
    """Every published number of ``path`` (default: the file beside this module), validated.

    Raises BadPublishedError: a malformed group or row, named with its field; or bad JSON.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise BadPublishedError(f"{path.name}: not JSON: {err}") from err
    return tuple(parse_published(document, path.name))


def published(source_id: str) -> tuple[Published, ...]:
    """The numbers of one source (``magi-cp-h100``), in file order (ValueError: no such source)."""
    rows = tuple(p for p in load_published() if p.source_id == source_id)
    if not rows:
        known = sorted({p.source_id for p in load_published()})
        raise ValueError(f"no published source {source_id!r}; known: {', '.join(known)}")
    return rows
