"""Read the results tables back from printed text, as a reader finds them.

`printed_rows` gives each row's kernel, cp, mask, seqlen and status: from the row, or from its
table's title where every row of the table shares the value. A cut identifier ("causal_do…"),
one wrapped over two lines or a row that lost its column comes back as a different value, so a
test comparing these rows with its records sees it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lcab.records.schema import RunRecord

_SHARED = re.compile(r"(?:^|[:,] ?)(kernel|cp|mask)=([^\s,]+)")


def _title_like(line: str) -> bool:
    """A table's title (or a line after the tables): a row has neither ``: `` nor ``, ``."""
    text = line.strip()
    return (
        ": " in text
        or ", " in text
        or text.startswith(("kernel=", "cp=", "mask=", "["))
        or len(text.split()) < 3
    )


def printed_rows(text: str) -> list[dict[str, str]]:
    """Every row of every results table in ``text`` (see the module docstring)."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if line.strip() and set(line.strip()) == {"─"}]
    rows: list[dict[str, str]] = []
    for i in rules:
        head = lines[i - 1].split()  # the header's bottom line names every one-line column
        title, j = [], i - 3
        while j >= 0 and lines[j].strip() and _title_like(lines[j]):
            title.insert(0, lines[j].strip())
            j -= 1
        shared = dict(pair for line in title for pair in _SHARED.findall(line))
        loose = head[: head.index("seqlen")]
        status_at = len(loose) + (2 if "rank" in head else 1)
        for line in lines[i + 1 :]:
            if not line.strip() or _title_like(line):
                break
            cells = line.split()
            rows.append(
                dict(zip(loose, cells, strict=False))
                | shared
                | {"seqlen": cells[len(loose)], "status": cells[status_at]}
            )
    return rows


def row_keys(rows: Sequence[dict[str, str]]) -> list[tuple[str, ...]]:
    """Rows as sorted (kernel, cp, mask, seqlen, status) tuples, to compare whatever the order."""
    return sorted(
        tuple(row.get(k, "") for k in ("kernel", "cp", "mask", "seqlen", "status")) for row in rows
    )


def expected_keys(records: Sequence[RunRecord]) -> list[tuple[str, ...]]:
    """The `row_keys` that printing ``records`` must show."""
    return sorted((r.kernel, r.cp, r.mask, f"{r.seqlen:,}", r.status) for r in records)
