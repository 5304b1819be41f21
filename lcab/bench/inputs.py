"""Benchmark inputs any rank can build in part: q, k, v and dout drawn block by block from a seed.

At CP lengths no process may hold the global tensors (8K tokens x 96 GPUs: one fp32 K is 12 GiB
per 32 heads), yet every shard and the fp64 reference must see the same numbers: each block of
`BLOCK_TOKENS` of each tensor has its own generator, seeded from (seed, length, sample, tensor,
block), so values never depend on who draws them or in what order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lcab.kernels import Problem
from lcab.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

BLOCK_TOKENS = 128
"""Tokens per seeded block: a scattered shard draws little waste, a generator serves 128 tokens."""

NAMES = ("q", "k", "v", "dout")


@dataclass(frozen=True)
class SeededInputs:
    """The global q, k, v, dout of one (cell, length, mask sample), drawn on demand."""

    seed: int
    seqlen: int
    sample: int
    problem: Problem

    def heads(self, name: str) -> int:
        """Heads of tensor ``name`` (query heads for q and dout, K/V heads for k and v)."""
        return self.problem.heads_kv if name in ("k", "v") else self.problem.heads_q

    def _block(self, name: str, block: int) -> torch.Tensor:
        """Block ``block`` of tensor ``name`` in float32 on the host (the seeded draw)."""
        key = hash((self.seed, self.seqlen, self.sample, NAMES.index(name), block)) % (1 << 62)
        gen = torch.Generator().manual_seed(key)
        start = block * BLOCK_TOKENS
        tokens = min(start + BLOCK_TOKENS, self.seqlen) - start
        return torch.randn((tokens, self.heads(name), self.problem.head_dim), generator=gen)

    def _place(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(dtype=self.problem.torch_dtype, device=self.problem.device)

    def rows(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """Tokens ``index`` (global, any order) of ``name``, drawing only the blocks they are in."""
        index = index.to("cpu", torch.long)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.seqlen):
            raise IndexError(f"token index out of range [0, {self.seqlen}) for {name!r}")
        out = torch.empty((len(index), self.heads(name), self.problem.head_dim))
        blocks = index // BLOCK_TOKENS
        for block in torch.unique(blocks).tolist():
            picked = blocks == block
            out[picked] = self._block(name, block)[index[picked] - block * BLOCK_TOKENS]
        return self._place(out)

    def span(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Tokens ``start:stop`` of ``name`` (a key chunk streamed by the reference)."""
        return self.rows(name, torch.arange(start, stop))

    def whole(self, name: str) -> torch.Tensor:
        """The global tensor: single-device cells and the bounded full reference only."""
        return self.span(name, 0, self.seqlen)

    def shard(self, name: str, layout: torch.Tensor) -> torch.Tensor:
        """A rank's shard: token ``layout[i]`` at slot i, zeros where the layout pads (-1)."""
        real = layout >= 0
        out = torch.zeros(
            (len(layout), self.heads(name), self.problem.head_dim),
            dtype=self.problem.torch_dtype,
            device=self.problem.device,
        )
        out[real.to(out.device)] = self.rows(name, layout[real])
        return out
