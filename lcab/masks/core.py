"""`AttnMask`: the one representation of an attention mask in lcab.

A mask is a set of non-overlapping slices ``(q_start, q_end, k_start, k_end, kind)`` over one
packed sequence, so the exact area is the sum of closed-form slice areas. Dynamic block-sparse
masks keep one slice set per KV head (CSR: ``head_ptr[h]:head_ptr[h+1]``). Every other form
(`lcab.masks.lowering`) is derived from the slices and checked against `AttnMask.to_dense`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lcab.lazy import lazy_module
from lcab.masks.checks import validate_slices
from lcab.masks.geometry import (
    IntArray,
    SliceKind,
    clip_slices,
    row_spans,
    slice_areas,
    transpose_slices,
)

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

#: Largest dense mask `to_dense` builds by default (elements): 2**28 bools = 256 MiB.
DENSE_LIMIT = 1 << 28

#: Sequence lengths must stay below this so closed-form areas cannot overflow int64.
MAX_SEQLEN = 1 << 30


@dataclass(frozen=True)
class RowIntervals:
    """Canonical per-row form: row r attends ``[starts[p], ends[p])`` for p in ``ptr[r]:ptr[r+1]``.

    Rows run over heads first (row = head * seqlen_q + q). Intervals are merged and sorted, so
    two masks attend the same pairs exactly when their `RowIntervals` are equal.
    """

    ptr: IntArray
    starts: IntArray
    ends: IntArray

    def max_per_row(self) -> int:
        """Largest number of separate intervals any row has."""
        return int(np.diff(self.ptr).max(initial=0))


class AttnMask:
    """An attention mask as non-overlapping slices, with its provenance.

    Raises ValueError: a slice out of bounds, empty, of unknown kind, or overlapping another.

    Args:
        slices: (N, 5) integer array of ``(q_start, q_end, k_start, k_end, kind)``; kind is a
            `SliceKind` code (0 full, 1 causal bottom-right, 2 inv_causal top-left, 3 bi_causal).
        seqlen_q: number of query rows.
        seqlen_k: number of key columns (defaults to ``seqlen_q``).
        head_ptr: for per-KV-head masks, CSR offsets (num_heads + 1) into ``slices``.
        name: pattern name (``"custom"`` for hand-built masks).
        params: the pattern's parameters, recorded for replay.
        seed: the seed the pattern was drawn with (None if not random).
        doc_lengths: packed document lengths (sum = seqlen) for masks made of documents.
        origin: position of this mask's (0, 0) in the mask it was restricted from.
        validate: check bounds, kinds, emptiness and overlap (cheap; keep it on).

    """

    __hash__ = None  # type: ignore[assignment]  # mutable-looking numpy payload: compare, don't hash

    def __init__(
        self,
        slices: Any,
        seqlen_q: int,
        seqlen_k: int | None = None,
        *,
        head_ptr: Any = None,
        name: str = "custom",
        params: Mapping[str, Any] | None = None,
        seed: int | None = None,
        doc_lengths: Any = None,
        origin: tuple[int, int] = (0, 0),
        validate: bool = True,
    ) -> None:
        seqlen_k = seqlen_q if seqlen_k is None else seqlen_k
        for key, value in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
            if not isinstance(value, (int, np.integer)) or not 0 < value < MAX_SEQLEN:
                raise ValueError(
                    f"{key}={value!r} is invalid: need an integer in [1, {MAX_SEQLEN})"
                )
        arr = np.asarray(slices, dtype=np.int64)
        if arr.size == 0:
            arr = arr.reshape(0, 5)
        if arr.ndim != 2 or arr.shape[1] != 5:
            raise ValueError(
                f"slices must have shape (N, 5) = (q_start, q_end, k_start, k_end, kind); "
                f"got {tuple(arr.shape)}"
            )
        ptr = np.array([0, len(arr)], dtype=np.int64) if head_ptr is None else np.asarray(head_ptr)
        ptr = ptr.astype(np.int64)
        if (
            ptr.ndim != 1
            or len(ptr) < 2
            or ptr[0] != 0
            or ptr[-1] != len(arr)
            or (np.diff(ptr) < 0).any()
        ):
            raise ValueError(
                f"head_ptr must be non-decreasing offsets from 0 to len(slices)={len(arr)}; "
                f"got {ptr.tolist()}"
            )
        self.slices: IntArray = np.ascontiguousarray(arr)
        self.head_ptr: IntArray = ptr
        self.seqlen_q = int(seqlen_q)
        self.seqlen_k = int(seqlen_k)
        self.name = name
        self.params: dict[str, Any] = dict(params or {})
        self.seed = seed
        self.origin = (int(origin[0]), int(origin[1]))
        self.doc_lengths: IntArray | None = None
        if doc_lengths is not None:
            lengths = np.asarray(doc_lengths, dtype=np.int64)
            if lengths.ndim != 1 or (lengths <= 0).any() or lengths.sum() != self.seqlen_q:
                raise ValueError(
                    f"doc_lengths must be positive and sum to seqlen_q={self.seqlen_q}; got "
                    f"{len(lengths)} lengths summing to {int(lengths.sum())}"
                )
            self.doc_lengths = lengths
        if validate:
            validate_slices(self.slices, self.head_ptr, self.seqlen_q, self.seqlen_k)

    @classmethod
    def from_head_parts(
        cls,
        parts: Sequence[IntArray],
        seqlen_q: int,
        seqlen_k: int,
        like: AttnMask,
        *,
        name: str | None = None,
        doc_lengths: Any = None,
        origin: tuple[int, int] = (0, 0),
    ) -> AttnMask:
        """A mask of one slice array per head, with ``like``'s name (unless ``name``), params, seed.

        Not validated: ``parts`` come from a valid mask by operations that keep slices disjoint.
        """
        ptr = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        return cls(
            np.concatenate(parts) if len(parts) else np.zeros((0, 5), np.int64),
            seqlen_q,
            seqlen_k,
            head_ptr=ptr,
            name=like.name if name is None else name,
            params=like.params,
            seed=like.seed,
            doc_lengths=doc_lengths,
            origin=origin,
            validate=False,
        )

    # ------------------------------------------------------------------ structure
    @property
    def num_heads(self) -> int:
        """Number of mask heads: 1 for static masks, the KV head count for dynamic ones."""
        return len(self.head_ptr) - 1

    @property
    def num_slices(self) -> int:
        """Total number of slices over all heads."""
        return len(self.slices)

    @property
    def shape(self) -> tuple[int, int]:
        """(seqlen_q, seqlen_k)."""
        return (self.seqlen_q, self.seqlen_k)

    @property
    def num_docs(self) -> int | None:
        """Number of packed documents, or None if the mask is not built from documents."""
        return None if self.doc_lengths is None else len(self.doc_lengths)

    @property
    def doc_boundaries(self) -> IntArray | None:
        """Cumulative document offsets ``[0, l0, l0+l1, ..., S]`` (cu_seqlens), or None."""
        if self.doc_lengths is None:
            return None
        return np.concatenate([[0], np.cumsum(self.doc_lengths)]).astype(np.int64)

    def head_slices(self, head: int) -> IntArray:
        """The (n, 5) slice rows of one mask head."""
        return self.slices[self.head_ptr[head] : self.head_ptr[head + 1]]

    def head(self, head: int) -> AttnMask:
        """A one-head mask holding mask head ``head``."""
        return self._derive(self.head_slices(head), None)

    # ------------------------------------------------------------------ measures
    def area(self) -> int:
        """Exact number of attended (q, k) pairs, summed over mask heads. O(#slices)."""
        return int(slice_areas(self.slices).sum())

    def density(self) -> float:
        """Attended fraction of the Sq x Sk grid (averaged over mask heads)."""
        return self.area() / (self.num_heads * self.seqlen_q * self.seqlen_k)

    # ------------------------------------------------------------------ derived masks
    def restrict(self, q_range: tuple[int, int], k_range: tuple[int, int]) -> AttnMask:
        """The sub-mask of q_range x k_range in local coordinates (a CP step), clipped exactly."""
        q0, q1 = (int(x) for x in q_range)
        k0, k1 = (int(x) for x in k_range)
        if not (0 <= q0 < q1 <= self.seqlen_q and 0 <= k0 < k1 <= self.seqlen_k):
            raise ValueError(
                f"restrict(q_range={q_range}, k_range={k_range}) is outside the mask "
                f"[0, {self.seqlen_q}) x [0, {self.seqlen_k}) or empty"
            )
        shift = np.array([q0, q0, k0, k0, 0], dtype=np.int64)
        parts = [
            clip_slices(self.head_slices(h), q0, q1, k0, k1) - shift for h in range(self.num_heads)
        ]
        docs = None
        if self.doc_lengths is not None and (q0, q1) == (k0, k1):
            cu = np.clip(self.doc_boundaries, q0, q1) - q0  # type: ignore[arg-type]
            docs = np.diff(cu)
            docs = docs[docs > 0]
        return AttnMask.from_head_parts(
            parts,
            q1 - q0,
            k1 - k0,
            self,
            doc_lengths=docs,
            origin=(self.origin[0] + q0, self.origin[1] + k0),
        )

    def transpose(self) -> AttnMask:
        """The mask with queries and keys swapped (column view, e.g. for FlashMask)."""
        parts = [transpose_slices(self.head_slices(h)) for h in range(self.num_heads)]
        return AttnMask.from_head_parts(
            parts, self.seqlen_k, self.seqlen_q, self, name=f"{self.name}.T"
        )

    def _derive(self, slices: IntArray, head_ptr: IntArray | None) -> AttnMask:
        return AttnMask(
            slices,
            self.seqlen_q,
            self.seqlen_k,
            head_ptr=head_ptr,
            name=self.name,
            params=self.params,
            seed=self.seed,
            doc_lengths=self.doc_lengths,
            origin=self.origin,
            validate=False,
        )

    # ------------------------------------------------------------------ per-token forms
    def row_intervals(self) -> RowIntervals:
        """Merged attended column intervals of every row: the canonical form of the set.

        Costs O(total slice rows); fine up to a few million tokens for structured masks.
        """
        rows_all, first_all, last_all = [], [], []
        for h in range(self.num_heads):
            rows, first, last = row_spans(self.head_slices(h))
            rows_all.append(rows + h * self.seqlen_q)
            first_all.append(first)
            last_all.append(last)
        rows = np.concatenate(rows_all)
        first = np.concatenate(first_all)
        last = np.concatenate(last_all)
        order = np.lexsort((first, rows))
        rows, first, last = rows[order], first[order], last[order]
        # Running max of `last` within a row (offset by row so rows never mix), then an interval
        # starts a new run where it does not touch the run before it.
        stride = self.seqlen_k + 2
        reach = np.maximum.accumulate(last + rows * stride) - rows * stride
        new_run = np.ones(len(rows), dtype=bool)
        new_run[1:] = (rows[1:] != rows[:-1]) | (first[1:] > reach[:-1] + 1)
        starts_idx = np.flatnonzero(new_run)
        run_rows = rows[starts_idx]
        run_first = first[starts_idx]
        run_last = np.maximum.reduceat(last, starts_idx) if len(starts_idx) else last[:0]
        n_rows = self.num_heads * self.seqlen_q
        ptr = np.concatenate([[0], np.cumsum(np.bincount(run_rows, minlength=n_rows))])
        return RowIntervals(ptr.astype(np.int64), run_first, run_last + 1)

    def to_dense(self, max_elements: int = DENSE_LIMIT) -> torch.Tensor:
        """Boolean mask: (seqlen_q, seqlen_k), or (num_heads, seqlen_q, seqlen_k) per head.

        Raises ValueError: the dense mask would exceed ``max_elements`` elements.
        """
        total = self.num_heads * self.seqlen_q * self.seqlen_k
        if total > max_elements:
            raise ValueError(
                f"to_dense() of a {self.num_heads} x {self.seqlen_q} x {self.seqlen_k} mask needs "
                f"{total:,} elements, above max_elements={max_elements:,}; use the slices, "
                f"row_intervals() or restrict() a smaller window instead"
            )
        diff = np.zeros((self.num_heads * self.seqlen_q, self.seqlen_k + 1), dtype=np.int32)
        for h in range(self.num_heads):
            rows, first, last = row_spans(self.head_slices(h))
            rows = rows + h * self.seqlen_q
            np.add.at(diff, (rows, first), 1)
            np.add.at(diff, (rows, last + 1), -1)
        dense = np.cumsum(diff[:, :-1], axis=1) > 0
        dense = dense.reshape(self.num_heads, self.seqlen_q, self.seqlen_k)
        return torch.from_numpy(dense[0] if self.num_heads == 1 else dense)

    @classmethod
    def from_dense(cls, dense: Any, *, name: str = "custom") -> AttnMask:
        """Build a mask from a boolean (Sq, Sk) or (H, Sq, Sk) array.

        Each maximal run of attended columns becomes a full slice, and identical runs in
        consecutive rows are stacked into one rectangle. Meant for tests and small hand-made masks.
        """
        arr = np.asarray(dense.cpu() if isinstance(dense, torch.Tensor) else dense, dtype=bool)
        heads = arr[None] if arr.ndim == 2 else arr
        if heads.ndim != 3:
            raise ValueError(f"from_dense needs a 2-D or 3-D boolean array; got shape {arr.shape}")
        _, sq, sk = heads.shape
        parts = []
        for dense_h in heads:
            padded = np.zeros((sq, sk + 2), dtype=np.int8)
            padded[:, 1:-1] = dense_h
            edges = np.diff(padded, axis=1)
            r_on, c_on = np.nonzero(edges == 1)
            _, c_off = np.nonzero(edges == -1)
            runs = np.stack([r_on, c_on, c_off], 1)  # row-major order: sorted by row, then column
            keys: dict[tuple[int, int], int] = {}
            out: list[list[int]] = []
            for r, c0, c1 in runs.tolist():
                prev = keys.get((c0, c1))
                if prev is not None and out[prev][1] == r:
                    out[prev][1] = r + 1
                else:
                    keys[(c0, c1)] = len(out)
                    out.append([r, r + 1, c0, c1, int(SliceKind.FULL)])
            parts.append(np.asarray(out, dtype=np.int64).reshape(-1, 5))
        ptr = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
        return cls(
            np.concatenate(parts),
            sq,
            sk,
            head_ptr=ptr if len(heads) > 1 or arr.ndim == 3 else None,
            name=name,
        )

    # ------------------------------------------------------------------ presentation
    def __eq__(self, other: object) -> bool:
        """Same shape, same number of heads and exactly the same attended pairs."""
        if not isinstance(other, AttnMask):
            return NotImplemented
        if (self.shape, self.num_heads) != (other.shape, other.num_heads):
            return False
        if self.area() != other.area():
            return False
        a, b = self.row_intervals(), other.row_intervals()
        return all(
            np.array_equal(x, y)
            for x, y in ((a.ptr, b.ptr), (a.starts, b.starts), (a.ends, b.ends))
        )

    def summary(self) -> str:
        """One line: pattern, sizes, slices, documents and density."""
        parts = [
            self.name,
            f"S={self.seqlen_q:,}"
            if self.seqlen_q == self.seqlen_k
            else f"Sq={self.seqlen_q:,} Sk={self.seqlen_k:,}",
            f"slices={self.num_slices:,}",
        ]
        if self.num_heads > 1:
            parts.append(f"heads={self.num_heads}")
        if self.doc_lengths is not None:
            parts.append(
                f"docs={len(self.doc_lengths):,} (longest {int(self.doc_lengths.max()):,})"
            )
        parts.append(f"density={self.density():.4f}")
        return " ".join(parts)

    def __repr__(self) -> str:
        docs = "" if self.doc_lengths is None else f", docs={len(self.doc_lengths)}"
        heads = "" if self.num_heads == 1 else f", heads={self.num_heads}"
        return (
            f"AttnMask(name={self.name!r}, shape={self.shape}, slices={self.num_slices}{heads}"
            f"{docs}, area={self.area()}, seed={self.seed})"
        )
