"""Planning for the tiled engine: work items → batches, all at prepare time (plain data).

Gathered items put their binding columns first (one masked prefix per batch); a large item with
contiguous keys runs alone on views; small items are padded to a common bucket (≤ 12.5 %) and
run as one ``bmm``; a batch's scores stay below `SCORE_BUDGET_BYTES`, longer key lists are cut
into parts merged by log-sum-exp in successive *waves*.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lcab.kernels.tiled.items import (
    WorkItems,
    blocked_mask,
    cut_pieces,
    piece_columns,
    pieces_in_order,
)
from lcab.lazy import lazy_module
from lcab.masks.geometry import IntArray

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

#: Largest score matrix of one batch, in float32 bytes: about three per worker in the backward,
#: so two workers stay near 100 MiB while a batch is still milliseconds of GEMM work.
SCORE_BUDGET_BYTES = 16 << 20

#: Items with at least this many scores (all heads) run alone on views when their keys are
#: contiguous; smaller ones are padded and batched with similar items (one bmm for many).
VIEW_MIN_SCORES = 1 << 20

#: Most masked windows a view item may have (a band piece binds at its two edges).
MAX_VIEW_WINDOWS = 2

#: Score of masked pairs: finite, so a row with every key masked gives no NaN; such rows are
#: recognised by their lse and zeroed in the batches where they can occur (`Batch.may_empty`).
MASKED = -1e30

#: Log-sum-exp below this means "every key of the row was masked in this batch".
EMPTY_LSE = MASKED / 2

#: Padding that always counts as cheap (scores), so thousands of tiny items share few batches.
CHEAP_PAD_SCORES = 1 << 15


def _bucket(n: int, other: int, scale: int) -> int:
    """Padded size for ``n`` (≤12.5 % extra), coarser when the padding costs little in total."""
    fine = n if n < 16 else -(-n // (1 << (n.bit_length() - 4))) * (1 << (n.bit_length() - 4))
    coarse = max(fine, 16)
    return coarse if (coarse - n) * other * scale <= CHEAP_PAD_SCORES else fine


@dataclass
class _Part:
    """One schedulable unit: an item, or one key part of a long item."""

    head: int
    q0: int
    q1: int
    sub: np.ndarray
    view: bool
    wave: int = 0
    multi: bool = False
    """Other parts cover some of the same rows (merged by log-sum-exp)."""


@dataclass
class Batch:
    """One Python iteration of the run: a bmm over gathered rows/keys, or over views."""

    wave: int
    rows: int
    """Rows per item (padded)."""
    keys: int
    """Keys per item (padded)."""
    items: int
    """Items in the batch (before repeating over KV heads for a head-shared mask)."""
    row_read: torch.Tensor | None = None
    """Packed q rows (s·Hkv + h) of a gathered batch; padded rows read row 0."""
    row_write: torch.Tensor | None = None
    """Same rows for out/lse/dq/dout; padded rows point at the trash row Hkv·Sq."""
    key_index: torch.Tensor | None = None
    """Packed key rows (c·Hkv + h); padded keys read key 0 (always masked)."""
    view: tuple[int, int, int, int, int] | None = None
    """(head or -1 for all heads, q0, q1, k0, k1) of a view batch."""
    windows: tuple[tuple[int, int, torch.Tensor], ...] = ()
    """(c0, c1, blocked) where blocked is bool (items, rows, c1 - c0): masked-out scores."""
    cost: int = 0
    """Score count (all heads): what the scheduler balances across workers."""
    may_empty: bool = False
    """Some row of the batch may have every key masked (its out/lse need fixing)."""
    rescale: bool = False
    """Backward must rescale P: rows seen by other batches too, or rows with no key here."""


class TiledPlan:
    """Work items compiled into batches for one problem (``shared``: one mask for all KV heads)."""

    def __init__(
        self,
        items: WorkItems,
        *,
        seqlen_q: int,
        seqlen_k: int,
        heads_q: int,
        heads_kv: int,
        shared: bool,
        device: torch.device | None = None,
        budget_bytes: int = SCORE_BUDGET_BYTES,
    ) -> None:
        self.seqlen_q, self.seqlen_k = seqlen_q, seqlen_k
        self.heads_q, self.heads_kv = heads_q, heads_kv
        self.group = heads_q // heads_kv
        self.shared = shared
        self.rep = heads_kv if shared else 1
        self.device = torch.device("cpu") if device is None else device
        self.budget = max(1, budget_bytes // 4)
        parts = self._parts(items)
        self.batches = self._batches(parts, items.tiles)
        self.num_items = items.num_items
        self.waves = 1 + max((b.wave for b in self.batches), default=0)
        self.untouched = self._tensor(self._untouched_rows(parts))
        """Packed rows no batch writes (their out stays 0 and lse -inf)."""

    def _parts(self, items: WorkItems) -> list[_Part]:
        """Order each item's columns, cut long items into key parts and assign waves."""
        heads = 1 if self.shared else self.heads_kv
        touched = np.zeros((heads, self.seqlen_q), dtype=np.int64)
        per_row = self.rep * self.group
        parts: list[_Part] = []
        for n in range(items.num_items):
            sub = pieces_in_order(items, n)
            if len(sub) == 0:
                continue
            head, q0, q1 = int(items.head[n]), int(items.q0[n]), int(items.q1[n])
            rows = q1 - q0
            keys = int((sub[:, 1] - sub[:, 0]).sum())
            view = False
            if per_row * rows * keys >= VIEW_MIN_SCORES:
                ordered = sub[np.lexsort((sub[:, 0],))]
                contiguous = bool((ordered[1:, 0] == ordered[:-1, 1]).all())
                bind = ordered[:, 6]
                windows = int(bind[0]) + int(((bind[1:] == 1) & (bind[:-1] == 0)).sum())
                if contiguous and windows <= MAX_VIEW_WINDOWS:
                    sub, view = ordered, True
            if not view:  # binding columns first: one masked prefix per gathered batch
                sub = sub[np.argsort(-sub[:, 6], kind="stable")]
            max_keys = max(1, self.budget // (per_row * rows))
            count = -(-keys // max_keys)
            cuts = [keys * i // count for i in range(count + 1)]
            for c0, c1 in itertools.pairwise(cuts):
                wave = int(touched[head, q0:q1].max())
                touched[head, q0:q1] = wave + 1
                parts.append(_Part(head, q0, q1, cut_pieces(sub, c0, c1), view, wave))
        for p in parts:
            p.multi = bool(touched[p.head, p.q0 : p.q1].max() > 1)
        return parts

    def _batches(self, parts: list[_Part], tiles: np.ndarray | None) -> list[Batch]:
        """Views run alone; gathered parts are grouped by (wave, padded rows, padded keys)."""
        batches = [self._view_batch(p, tiles) for p in parts if p.view]
        groups: dict[tuple[int, int, int], list[_Part]] = {}
        scale = self.rep * self.group
        for p in parts:
            if p.view:
                continue
            keys = int((p.sub[:, 1] - p.sub[:, 0]).sum())
            rows = _bucket(p.q1 - p.q0, keys, scale)
            keys = _bucket(keys, rows, scale)
            groups.setdefault((p.wave, rows, keys), []).append(p)
        for (wave, rows, keys), members in groups.items():
            per_item = scale * rows * keys
            size = max(1, self.budget // per_item)
            count = -(-len(members) // size)
            for i in range(count):
                chunk = members[len(members) * i // count : len(members) * (i + 1) // count]
                batches.append(self._gather_batch(chunk, wave, rows, keys, tiles))
        batches.sort(key=lambda b: b.wave)
        return batches

    def _view_batch(self, part: _Part, tiles: np.ndarray | None) -> Batch:
        sub = part.sub
        rows = np.arange(part.q0, part.q1, dtype=np.int64)
        lengths = sub[:, 1] - sub[:, 0]
        offsets = np.cumsum(lengths) - lengths
        windows = []
        i = 0
        while i < len(sub):
            if sub[i, 6] == 0:
                i += 1
                continue
            j = i
            while j + 1 < len(sub) and sub[j + 1, 6] == 1:
                j += 1
            run = sub[i : j + 1]
            blocked = blocked_mask(rows, piece_columns(run), run, tiles, part.q0)
            c0 = int(offsets[i])
            windows.append((c0, c0 + blocked.shape[1], self._tensor(blocked[None])))
            i = j + 1
        head = -1 if self.shared else part.head
        view = (head, part.q0, part.q1, int(sub[0, 0]), int(sub[-1, 1]))
        masked = sum(c1 - c0 for c0, c1, _ in windows)
        may_empty = masked == int(lengths.sum()) and bool(
            np.logical_and.reduce([w[2][0].cpu().numpy().all(1) for w in windows]).any()
        )
        keys = int(lengths.sum())
        return Batch(
            part.wave,
            len(rows),
            keys,
            1,
            view=view,
            windows=tuple(windows),
            cost=self.rep * self.group * len(rows) * keys,
            may_empty=may_empty,
            rescale=may_empty or part.multi,
        )

    def _gather_batch(
        self, parts: list[_Part], wave: int, rows: int, keys: int, tiles: np.ndarray | None
    ) -> Batch:
        n = len(parts)
        row_ids = np.full((n, rows), -1, dtype=np.int64)
        col_ids = np.full((n, keys), -1, dtype=np.int64)
        binding = [int((p.sub[:, 6] * (p.sub[:, 1] - p.sub[:, 0])).sum()) for p in parts]
        pads = []
        width = 0
        for i, p in enumerate(parts):
            cols = piece_columns(p.sub)
            nb = binding[i]
            pad = keys - len(cols)
            pads.append(pad)
            row_ids[i, : p.q1 - p.q0] = np.arange(p.q0, p.q1)
            col_ids[i, :nb] = cols[:nb]
            col_ids[i, nb + pad :] = cols[nb:]
            width = max(width, nb + pad)
        blocked = np.zeros((n, rows, width), dtype=bool)
        may_empty = False
        for i, p in enumerate(parts):
            nb, pad = binding[i], pads[i]
            live = p.q1 - p.q0
            blocked[i, :, nb : nb + pad] = True  # padded rows keep their (zero) scores
            if nb:
                bind = p.sub[p.sub[:, 6] == 1]
                blocked[i, :live, :nb] = blocked_mask(
                    row_ids[i, :live], col_ids[i, :nb], bind, tiles, p.q0
                )
                all_bound = nb + pad == keys
                may_empty |= all_bound and bool(blocked[i, :live, :nb].all(1).any())
        heads = np.array([p.head for p in parts], dtype=np.int64)[:, None]
        hkv = self.heads_kv
        if self.shared:  # every KV head runs the same items: (Hkv, items, ...) indices
            heads = np.arange(hkv, dtype=np.int64)[:, None, None]
            row_ids, col_ids = row_ids[None], col_ids[None]
        # Packed row (s, h) is s·Hkv + h: the memory layout of q (S, Hq, D) and of out.
        rows_at = row_ids * hkv + heads
        row_read = np.where(row_ids >= 0, rows_at, 0)  # padded rows read any real row...
        row_write = np.where(row_ids >= 0, rows_at, hkv * self.seqlen_q)  # ...write to trash
        key_read = np.where(col_ids >= 0, col_ids * hkv + heads, 0)  # padded keys are masked
        windows = ((0, width, self._tensor(blocked)),) if width else ()
        return Batch(
            wave,
            rows,
            keys,
            n,
            row_read=self._tensor(row_read.reshape(-1)),
            row_write=self._tensor(row_write.reshape(-1)),
            key_index=self._tensor(key_read.reshape(-1)),
            windows=windows,
            cost=self.rep * self.group * n * rows * keys,
            may_empty=may_empty,
            rescale=may_empty or any(p.multi for p in parts),
        )

    def _untouched_rows(self, parts: list[_Part]) -> IntArray:
        heads = 1 if self.shared else self.heads_kv
        seen = np.zeros((heads, self.seqlen_q + 1), dtype=np.int64)
        for p in parts:
            seen[p.head, p.q0] += 1
            seen[p.head, p.q1] -= 1
        free = np.cumsum(seen[:, :-1], axis=1) == 0  # (heads, Sq)
        if self.shared:
            free = np.broadcast_to(free, (self.heads_kv, self.seqlen_q))
        h, s = np.nonzero(free)
        return (s * self.heads_kv + h).astype(np.int64)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def wave_batches(self) -> list[list[Batch]]:
        """Batches of each wave, largest first (the order workers pull them in)."""
        return [
            sorted((b for b in self.batches if b.wave == w), key=lambda b: -b.cost)
            for w in range(self.waves)
        ]

    def describe(self) -> dict[str, int]:
        """Plan statistics: items, batches, view batches, waves, computed scores (all heads)."""
        return {
            "items": self.num_items,
            "batches": len(self.batches),
            "view_batches": sum(b.view is not None for b in self.batches),
            "waves": self.waves,
            "computed_scores": sum(b.cost for b in self.batches),
        }
