"""Time, throughput and memory of a replayed plan on a hardware profile.

Ranks run in lockstep, stage by stage: a ring step cannot start before the previous rank has
sent its block, and a collective ends when its slowest member does, so every stage lasts as long
as its slowest rank. A stage's time on one rank is ``max(compute, transfers during it) +
transfers after it``; a window adds the transfers running in its background (LoongTrain's
prefetch). Summed over stages this is the paper's max-rank-time convention, and it splits
exactly into

* compute — the mean rank's kernel time,
* imbalance — what the slowest rank's kernel time adds to it,
* exposed communication — the rest: transfers the compute did not hide.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lcab.cp.stages import Stage, Transfer
from lcab.plan.hardware import Hardware, KernelRate
from lcab.plan.replay import Replay
from lcab.plan.steps import Work


@dataclass(frozen=True)
class PassPrediction:
    """One pass of one cell, predicted."""

    time_ms: float
    compute_ms: float
    imbalance_ms: float
    comm_ms: float
    """Exposed communication."""
    tflops: float
    """Per-GPU TFLOP/s: global FLOPs / (world × time)."""
    intra_bytes: int
    """Most bytes any rank sends inside its node."""
    inter_bytes: int
    """Most bytes any rank sends to other nodes."""


class CostModel:
    """Costs of work and transfers on ``hardware`` for ``kernel``, with ``ranks_per_node``.

    ``alone``: a single-device cell, which on a CPU profile runs on every core, where a rank of
    a context-parallel cell runs on one thread and ranks beyond the cores share them.
    """

    def __init__(
        self, hardware: Hardware, kernel: str, ranks_per_node: int, alone: bool = False
    ) -> None:
        self.hw = hardware
        self.rate: KernelRate = hardware.rate(kernel)
        slots = hardware.compute_slots_per_node
        if slots is None:
            self.compute_share = 1.0
        else:
            self.compute_share = float(slots) if alone else min(1.0, slots / ranks_per_node)
        self.ranks_per_node = ranks_per_node
        self.matmul_tflops = hardware.matmul_tflops or self.rate.fwd_tflops

    def compute_s(self, work: Work | None, bwd: bool) -> float:
        """Seconds of one kernel call, or of a harness's matrix products (``flops`` 0)."""
        if work is None:
            return 0.0
        if self.rate.dense_mask and work.dense_rows > 0:
            work = self.dense_call(work, bwd)
        moved = work.memory_bytes
        if bwd:  # the backward kernel's own passes over every token it is given
            rate = self.rate
            sequences = work.sequences or work.runs  # the accumulators' rows grow per sequence
            q_pad = sequences * rate.bwd_pad_q_rows * work.q_row_elements
            moved += work.q_elements * rate.bwd_q_bytes + q_pad * 8.0  # float32 zero + read
            if work.q_per_kv > 1:
                kv_pad = sequences * rate.bwd_pad_kv_rows * work.kv_row_elements
                moved += (work.kv_elements + kv_pad) * rate.bwd_kv_bytes
        bandwidth = self.hw.memory_gbps * 1e9 * self.compute_share
        # parts of memory_bytes at the lower rates of reads and writes through an index
        gathered, scattered = work.gather_bytes, work.scatter_bytes
        traffic = (
            (moved - gathered - scattered) / bandwidth
            + gathered / (bandwidth * self.hw.gather_efficiency)
            + scattered / (bandwidth * self.hw.scatter_efficiency)
        )
        idle = self.empty_blocks_s(work) if bwd else 0.0
        matmul = work.matmul_flops / (self.matmul_tflops * 1e12 * self.compute_share)
        if work.flops <= 0:
            return matmul + traffic + idle
        peak = (self.rate.bwd_tflops if bwd else self.rate.fwd_tflops) * 1e12 * self.compute_share
        flops = work.flops * self.position_factor(work, bwd)
        attention = flops / (peak * max(self.efficiency(work, bwd), 1e-9))
        return self.rate.call_us * 1e-6 + attention + matmul + traffic + idle

    def dense_call(self, work: Work, bwd: bool) -> Work:
        """What a dense-mask kernel runs for ``work``: its whole rectangle, and a bias read.

        Every position of ``dense_rows x dense_keys`` per query head is computed, each reading
        ``bias_bytes`` of the bias.
        """
        rate = self.rate
        positions = work.dense_rows * work.dense_keys * max(work.q_heads, 1.0)
        per_position = (10.0 if bwd else 4.0) * work.head_dim
        bias = rate.bwd_bias_bytes if bwd and rate.bwd_bias_bytes is not None else rate.bias_bytes
        return dataclasses.replace(
            work,
            flops=positions * per_position,
            mean_keys=work.dense_keys,
            mean_queries=work.dense_rows,
            rows=work.dense_rows,
            runs=1.0,
            key_columns=work.dense_keys,
            key_runs=1.0,
            key_documents=1.0,
            diagonal_rows=0.0,
            diagonal_runs=0.0,
            memory_bytes=work.memory_bytes + positions * bias,
            dense_rows=0.0,
            dense_keys=0.0,
        )

    def efficiency(self, work: Work, bwd: bool) -> float:
        """Fraction of the plateau a call's attention reaches.

        A forward kernel holds a query tile and sweeps its keys: each tile pays a fixed cost
        (``half_keys`` keys' worth) besides its sweep, and every run of query rows ends in a
        partly filled tile that costs a whole one. A backward kernel holds a key tile and sweeps
        the query tiles attending it: each key tile pays its fixed cost (``bwd_half_keys``
        queries' worth) once, the last query tile of every run it sweeps adds its padded rows
        to the sweep (not to the fixed cost), and every run of key columns (a varlen call's
        sequence) ends in a partly filled key tile. Both saturate with their sweep's length.
        """
        rate = self.rate
        half = rate.saturation_keys(bwd)
        tile = rate.tile_tokens(bwd, work.q_per_kv)
        padded = (tile - 1) / 2 if tile > 0 else 0.0  # rows a run's last tile wastes, on average
        masked = self.diagonal_share(work)
        if not bwd:
            efficiency = work.mean_keys / (work.mean_keys + half)
            if work.rows > 0:
                efficiency *= work.rows / (work.rows + work.runs * padded)
            return efficiency * masked
        sweep = work.mean_queries if work.mean_queries > 0 else work.mean_keys
        swept_runs = work.runs / max(work.key_runs, 1.0)  # query runs one key column sweeps
        efficiency = sweep / (sweep + swept_runs * padded + half)
        if rate.bwd_block_cols > 0 and work.key_columns > 0:
            key_padding = work.key_runs * (rate.bwd_block_cols - 1) / 2
            efficiency *= work.key_columns / (work.key_columns + key_padding)
        return efficiency * masked

    def position_factor(self, work: Work, bwd: bool) -> float:
        """A call's products plus its per-position work, over its products (1: products only).

        ``position_flops`` per attended position and query head beside ``4 x head_dim``
        forward (``10 x head_dim`` backward) products.
        """
        rate = self.rate
        extra = rate.position_flops
        if bwd and rate.bwd_position_flops is not None:
            extra = rate.bwd_position_flops
        if extra <= 0 or work.head_dim <= 0:
            return 1.0
        return 1.0 + extra / ((10.0 if bwd else 4.0) * work.head_dim)

    def diagonal_share(self, work: Work) -> float:
        """Attended share of what a kernel that masks whole pieces afterwards computes.

        Each run of rows on a band edge (``diagonal_runs``, ``diagonal_rows`` rows in all) is
        cut into pieces of ``diagonal_rows`` rows of the rate; a piece of ``n`` rows computes
        ``n (n - 1) / 2`` masked positions past the edge. Runs are taken at their mean length.
        """
        height = self.rate.diagonal_rows
        if height <= 1 or work.diagonal_runs <= 0 or work.rows <= 0:
            return 1.0
        length = work.diagonal_rows / work.diagonal_runs
        whole = np.floor(length / height)
        rest = length - whole * height
        masked = work.diagonal_runs * (whole * height * (height - 1) + rest * (rest - 1)) / 2
        area = work.rows * work.mean_keys  # per head
        return float(area / (area + masked))

    def empty_blocks_s(self, work: Work) -> float:
        """Seconds a varlen backward spends on launched thread blocks that have no work.

        The grid is sized by the call's longest key sequence for every sequence, so a call with
        many short documents (or empty ones, where the code lists them) launches mostly blocks
        that only read their sequence's length and exit; each still holds a multiprocessor.
        Busy blocks: each sequence's columns in whole tiles, on average half a tile padded.
        """
        rate, sms = self.rate, self.hw.multiprocessors
        if not (sms and rate.bwd_empty_block_us and rate.bwd_block_cols and work.longest_keys):
            return 0.0
        per_head = np.ceil(work.longest_keys / rate.bwd_block_cols) * work.sequences
        busy = work.key_columns / rate.bwd_block_cols + work.key_documents / 2
        empty = max(per_head - busy, 0.0) * work.q_heads
        return float(empty * rate.bwd_empty_block_us * 1e-6 / (sms * self.compute_share))

    def transfer_s(self, transfer: Transfer) -> float:
        """Seconds of one transfer: its slower part (intra- or inter-node) + latency, per phase.

        An unbatched ring exchange has two phases: it sends, then receives.
        """
        default = self.hw.efficiency.get(transfer.kind, 1.0)
        intra_bytes = transfer.nbytes - transfer.inter_bytes
        times = []
        for nbytes, link in ((intra_bytes, self.hw.intra), (transfer.inter_bytes, self.hw.inter)):
            if nbytes:
                share = self.ranks_per_node if link.shared else 1
                eff = link.efficiency.get(transfer.kind, default)
                times.append(link.latency_us * 1e-6 + nbytes * share / (link.gbps * 1e9 * eff))
        return transfer.phases * max(times, default=0.0)

    def stage_s(self, stage: Stage, bwd: bool) -> tuple[float, float]:
        """(stage seconds, of which compute) on one rank."""
        compute = sum((self.compute_s(work, bwd) for work in stage.calls), 0.0)
        finish = sum((self.compute_s(work, bwd) for work in stage.finish), 0.0)
        during = sum(self.transfer_s(t) for t in stage.during)
        after = sum(self.transfer_s(t) for t in stage.after)
        return max(compute, during) + finish + after, compute + finish


class _Memo(CostModel):
    """A cost model that costs each work and transfer object once (one pass of one replay).

    The replay shares one object between equal calls and transfers and holds them all while
    the pass is costed, so an object's id names it: 96 ranks x 96 steps cost the distinct ones.
    """

    def __init__(
        self, hardware: Hardware, kernel: str, ranks_per_node: int, alone: bool = False
    ) -> None:
        super().__init__(hardware, kernel, ranks_per_node, alone)
        self._compute: dict[tuple[int, bool], float] = {}
        self._transfer: dict[int, float] = {}
        self._stages: dict[int, tuple[float, float]] = {}

    def compute_s(self, work: Work | None, bwd: bool) -> float:
        key = (id(work), bwd)
        seconds = self._compute.get(key)
        if seconds is None:
            seconds = self._compute[key] = super().compute_s(work, bwd)
        return seconds

    def transfer_s(self, transfer: Transfer) -> float:
        seconds = self._transfer.get(id(transfer))
        if seconds is None:
            seconds = self._transfer[id(transfer)] = super().transfer_s(transfer)
        return seconds

    def stage_s(self, stage: Stage, bwd: bool) -> tuple[float, float]:
        costs = self._stages.get(id(stage))
        if costs is None:
            costs = self._stages[id(stage)] = super().stage_s(stage, bwd)
        return costs


def predict_pass(replay: Replay, hardware: Hardware, kernel: str, pass_: str) -> PassPrediction:
    """Predict ``pass_`` ("fwd" or "bwd") of ``replay`` (see module docstring)."""
    world = replay.plan.world
    model = _Memo(hardware, kernel, min(replay.devices_per_node, world), alone=world == 1)
    bwd = pass_ == "bwd"
    ranks = replay.passes[pass_]
    total = compute = imbalance = comm = 0.0
    for w in range(len(ranks[0])):
        windows = [rank[w] for rank in ranks]
        window_s = 0.0
        for s in range(len(windows[0].stages)):
            costs = np.array([model.stage_s(win.stages[s], bwd) for win in windows])
            stage_max, compute_max, compute_mean = (
                costs[:, 0].max(),
                costs[:, 1].max(),
                costs[:, 1].mean(),
            )
            window_s += stage_max
            compute += compute_mean
            imbalance += compute_max - compute_mean
            comm += stage_max - compute_max
        background = max(sum(model.transfer_s(t) for t in win.background) for win in windows)
        if background > window_s:
            comm += background - window_s
            window_s = background
        total += window_s
    intra, inter = _busiest_bytes(replay, pass_)
    flops = replay.global_flops[pass_]
    return PassPrediction(
        time_ms=total * 1e3,
        compute_ms=compute * 1e3,
        imbalance_ms=imbalance * 1e3,
        comm_ms=comm * 1e3,
        tflops=flops / (world * total) / 1e12 if total > 0 else 0.0,
        intra_bytes=intra,
        inter_bytes=inter,
    )


def _busiest_bytes(replay: Replay, pass_: str) -> tuple[int, int]:
    """(most bytes any rank sends inside its node, most any rank sends to other nodes)."""
    intra = inter = 0
    for rank in range(replay.plan.world):
        moved = replay.transfers(rank, pass_)
        far = sum(t.inter_bytes for t in moved)
        intra = max(intra, sum(t.nbytes for t in moved) - far)
        inter = max(inter, far)
    return intra, inter
