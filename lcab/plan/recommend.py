"""Which strategy, balancer and Ulysses degree to run, and the smallest world that fits.

Candidates are ranked by predicted forward + backward time, the median over the same mask
samples for all (one document pack can flatter one strategy); the answer states the margin to
the runner-up, since 3 % is inside a real cluster's noise and 2× is not.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from lcab.config.fork_map import fork_map, usable_cores
from lcab.cp import STRATEGIES
from lcab.cp.balance import BALANCERS
from lcab.masks.core import AttnMask
from lcab.plan.hardware import Hardware
from lcab.plan.harness import LCAB, Harness
from lcab.plan.predict import CellPrediction, PlanCell, cell_reasons, mask_for, predict


@dataclass(frozen=True)
class Recommendation:
    """Ranked candidates (best first) and the smallest world whose memory fits."""

    ranked: list[CellPrediction]
    smallest_fitting_nodes: int | None
    """Nodes of the smallest world (same devices per node) where the best strategy's attention
    memory per device fits the profile's memory less its margin (`Hardware.usable_mib`); None
    if none up to the topology's does."""

    @property
    def margin(self) -> float:
        """How much slower the runner-up is than the best (0.25 = 25 %)."""
        if len(self.ranked) < 2:
            return float("inf")
        return step_ms(self.ranked[1]) / step_ms(self.ranked[0]) - 1.0


def step_ms(p: CellPrediction) -> float:
    """Forward + backward time of a prediction."""
    return p.fwd.time_ms + p.bwd.time_ms


def candidates(cell: PlanCell) -> list[PlanCell]:
    """Every strategy x balancer (x Ulysses degree where it has one) that can run ``cell``.

    A strategy whose ranks always share one ring shard (Ulysses) computes and moves the same
    under every placement: its default one is tried alone.
    """
    out = []
    degrees = [d for d in range(2, cell.devices_per_node + 1) if cell.devices_per_node % d == 0]
    for name in STRATEGIES.names():
        cls = STRATEGIES.get(name)
        fields = {f.name: f.default for f in dataclasses.fields(cls.options_cls)}
        degree = cls({}, cell.devices_per_node).ulysses_degree(cell.world)
        one_shard = "ulysses_degree" not in fields and degree == cell.world
        for balance in (fields["balance"],) if one_shard else BALANCERS:
            options_list: list[dict[str, object]] = [{"balance": balance}]
            if "ulysses_degree" in fields:
                options_list = [{"balance": balance, "ulysses_degree": d} for d in degrees]
            for options in options_list:
                candidate = cell.with_(cp=name, cp_options=options)
                if not cell_reasons(candidate):
                    out.append(candidate)
    return out


def recommend(
    cell: PlanCell, hardware: Hardware, samples: int = 1, harness: Harness = LCAB
) -> Recommendation:
    """Rank `candidates` of ``cell`` over ``samples`` mask samples; the smallest world that fits.

    Each candidate is represented by its prediction of median step time over the samples (all
    candidates see the same masks); the memory check uses the first sample (attention memory
    follows the shapes and barely the documents).
    """
    masks = [mask_for(cell, s) for s in range(max(samples, 1))]
    step = functools.partial(median_step, hardware=hardware, masks=masks, harness=harness)
    # the candidates are independent: replayed on every core (a dozen at 96 ranks)
    ranked = sorted(fork_map(step, candidates(cell), usable_cores()), key=step_ms)
    fitting = None
    if ranked:
        best = ranked[0].cell
        limit = hardware.usable_mib(hardware.memory_gib * 1024)
        for nodes in range(1, best.nodes + 1):
            smaller = best.with_(nodes=nodes)
            if cell_reasons(smaller):
                continue
            if predict(smaller, hardware, masks[0], harness).memory_mib <= limit:
                fitting = nodes
                break
    return Recommendation(ranked, fitting)


def median_step(
    cell: PlanCell, hardware: Hardware, masks: list[AttnMask], harness: Harness = LCAB
) -> CellPrediction:
    """The prediction of median forward + backward time among ``masks``."""
    predictions = sorted((predict(cell, hardware, m, harness) for m in masks), key=step_ms)
    return predictions[(len(predictions) - 1) // 2]
